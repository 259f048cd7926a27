package ucp

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkPutUnderPolling: 8-byte puts over shared memory (a flush every 256) while
// another goroutine polls the same worker in a loop, as a progress loop of the user's
// or WorkerParams.ProgressThread does, against the same puts with nobody polling, in
// one run. Every nbx call takes the worker's lock, which the poller holds across UCX
// progress; ratio = ns per put polled / not polled.
func BenchmarkPutUnderPolling(b *testing.B) {
	ca, err := NewContext(ContextParams{})
	if err != nil {
		b.Fatal(err)
	}
	defer ca.Close()
	cb, err := NewContext(ContextParams{})
	if err != nil {
		b.Fatal(err)
	}
	defer cb.Close()
	wa, err := ca.NewWorker(WorkerParams{})
	if err != nil {
		b.Fatal(err)
	}
	wb, err := cb.NewWorker(WorkerParams{})
	if err != nil {
		b.Fatal(err)
	}
	addr, err := wb.Address()
	if err != nil {
		b.Fatal(err)
	}
	ep, err := wa.ConnectAddress(addr, &EndpointParams{NoPeerErrorHandling: true})
	if err != nil {
		b.Fatal(err)
	}
	region, err := cb.MemAlloc(4096)
	if err != nil {
		b.Fatal(err)
	}
	defer region.Close()
	packed, err := region.PackRkey()
	if err != nil {
		b.Fatal(err)
	}
	rk, err := ep.UnpackRkey(packed)
	if err != nil {
		b.Fatal(err)
	}
	stopB := background(wb)
	defer stopB()
	src := make([]byte, 8)
	ctx := context.Background()
	run := func(n int, polled bool) time.Duration {
		var stop atomic.Bool
		done := make(chan struct{})
		if polled {
			go func() {
				defer close(done)
				for !stop.Load() {
					wa.Progress()
				}
			}()
		} else {
			close(done)
		}
		t0 := time.Now()
		for i := 1; i <= n; i++ {
			if _, err := ep.PutNbx(src, rk.Base(), rk, nil); err != nil {
				b.Fatal(err)
			}
			if i%256 == 0 || i == n {
				f, err := ep.FlushNbx(nil)
				if err != nil {
					b.Fatal(err)
				}
				if err := f.Wait(ctx); err != nil {
					b.Fatal(err)
				}
			}
		}
		el := time.Since(t0)
		stop.Store(true)
		<-done
		return el
	}
	n := max(b.N, 20000)
	run(2000, false) // warm
	b.ResetTimer()
	free := run(n, false)
	polled := run(n, true)
	b.StopTimer()
	per := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / float64(n) }
	b.ReportMetric(per(free), "ns/put")
	b.ReportMetric(per(polled), "ns/put-polled")
	b.ReportMetric(per(polled)/per(free), "ratio")
}
