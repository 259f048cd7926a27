package ucp

import (
	"context"
	"testing"
)

// BenchmarkTagPingPong measures the tag ping-pong between two workers of one process
// over shared memory, each driven by its own goroutine (two cores busy, like
// ucx_perftest's tag_lat). ns/op is one round trip; half-rt-ns is the one-way latency.
func BenchmarkTagPingPong(b *testing.B) {
	for _, size := range []int{8, 4096} {
		b.Run(sizeName(size), func(b *testing.B) {
			p := newShmPair(&testing.T{})
			defer p.close(&testing.T{})
			ctx := context.Background()
			done := make(chan error, 1)
			n := b.N
			go func() {
				buf := make([]byte, size)
				for i := 0; i < n; i++ {
					r, err := p.b.TagRecvNbx(buf, 1, ^uint64(0), nil)
					if err == nil {
						err = r.Wait(ctx)
					}
					if err == nil {
						var s *Request
						s, err = p.epB.TagSendNbx(buf, 2, nil)
						if err == nil {
							err = s.Wait(ctx)
						}
					}
					if err != nil {
						done <- err
						return
					}
				}
				done <- nil
			}()
			buf := make([]byte, size)
			b.ResetTimer()
			for i := 0; i < n; i++ {
				r, err := p.a.TagRecvNbx(buf, 2, ^uint64(0), nil)
				if err != nil {
					b.Fatal(err)
				}
				s, err := p.epA.TagSendNbx(buf, 1, nil)
				if err != nil {
					b.Fatal(err)
				}
				if err := s.Wait(ctx); err != nil {
					b.Fatal(err)
				}
				if err := r.Wait(ctx); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			if err := <-done; err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/2, "half-rt-ns")
		})
	}
}

func sizeName(n int) string {
	switch {
	case n >= 1<<20:
		return itoa(n>>20) + "MiB"
	case n >= 1<<10:
		return itoa(n>>10) + "KiB"
	}
	return itoa(n) + "B"
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	var d []byte
	for ; n > 0; n /= 10 {
		d = append([]byte{byte('0' + n%10)}, d...)
	}
	return string(d)
}
