package ucp

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ucpx/ucpx/cgo/ucx"
)

// refPingPong runs n round trips in C alone (ucx.RefPingPong), each side in one cgo
// call holding its worker: the fastest the same UCX transport allows, measured in the
// same run as ucpx. It returns the initiator's elapsed time.
func refPingPong(b *testing.B, p *pair, size, n int) time.Duration {
	b.Helper()
	sa, ra, sb, rb := make([]byte, size), make([]byte, size), make([]byte, size), make([]byte, size)
	done := make(chan ucx.Status, 1)
	go func() {
		p.b.mu.Lock()
		st := p.b.raw.RefPingPong(p.epB.raw, bufPtr(sb), bufPtr(rb), size, uint64(n), false)
		p.b.mu.Unlock()
		done <- st
	}()
	start := time.Now()
	p.a.mu.Lock()
	st := p.a.raw.RefPingPong(p.epA.raw, bufPtr(sa), bufPtr(ra), size, uint64(n), true)
	p.a.mu.Unlock()
	elapsed := time.Since(start)
	if stB := <-done; st != ucx.OK || stB != ucx.OK {
		b.Fatalf("C reference ping-pong: %v / %v", st, stB)
	}
	return elapsed
}

// pingPongModes are the ways a ucpx loop can drive a ping-pong: the nbx calls with a
// fresh Request per operation (as `ucpx perf`), the nbx calls with caller-owned
// requests (RequestParam.Request), and the fused blocking calls.
var pingPongModes = []string{"nbx", "owned", "fused"}

// respond answers n pings on p.b the mode's way.
func respond(p *pair, mode string, size, n int) <-chan error {
	done := make(chan error, 1)
	go func() {
		ctx := context.Background()
		buf := make([]byte, size)
		var rp, sp *RequestParam
		if mode == "owned" {
			rp, sp = &RequestParam{Request: new(Request)}, &RequestParam{Request: new(Request)}
		}
		for i := 0; i < n; i++ {
			var err error
			if mode == "fused" {
				if _, _, err = p.b.TagRecv(ctx, buf, 1, ^uint64(0)); err == nil {
					err = p.epB.TagSend(ctx, buf, 2)
				}
			} else {
				var r, s *Request
				if r, err = p.b.TagRecvNbx(buf, 1, ^uint64(0), rp); err == nil {
					err = r.Wait(ctx)
				}
				if err == nil {
					if s, err = p.epB.TagSendNbx(buf, 2, sp); err == nil {
						err = s.Wait(ctx)
					}
				}
			}
			if err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	return done
}

// initiate runs n round trips on p.a the mode's way. As ucx_perftest's tag_lat, the
// send goes first, then the receive of the reply.
func initiate(p *pair, mode string, size, n int) error {
	ctx := context.Background()
	sbuf, rbuf := make([]byte, size), make([]byte, size)
	var rp, sp *RequestParam
	if mode == "owned" {
		rp, sp = &RequestParam{Request: new(Request)}, &RequestParam{Request: new(Request)}
	}
	for i := 0; i < n; i++ {
		if mode == "fused" {
			if _, _, err := p.epA.TagSendRecv(ctx, sbuf, 1, rbuf, 2, ^uint64(0)); err != nil {
				return err
			}
			continue
		}
		s, err := p.epA.TagSendNbx(sbuf, 1, sp)
		if err != nil {
			return err
		}
		r, err := p.a.TagRecvNbx(rbuf, 2, ^uint64(0), rp)
		if err != nil {
			return err
		}
		if err := r.Wait(ctx); err != nil {
			return err
		}
		if err := s.Wait(ctx); err != nil {
			return err
		}
	}
	return nil
}

// BenchmarkPingPongVsC measures a tag ping-pong between two workers of this process
// over shared memory, each side on its own goroutine, driven by ucpx in each mode, and
// the same ping-pong in C alone in the same run. ns/op is one round trip; x-C is ucpx's
// time over C's (the overhead of the Go path), C-ns/op the reference's round trip.
func BenchmarkPingPongVsC(b *testing.B) {
	for _, size := range []int{8, 4096} {
		for _, mode := range pingPongModes {
			b.Run(fmt.Sprintf("%s/%s", mode, sizeName(size)), func(b *testing.B) {
				p := newShmPair(&testing.T{})
				defer p.close(&testing.T{})
				// Warm both paths up (wire-up, caches, the worker's pools).
				refPingPong(b, p, size, 1000)
				done := respond(p, mode, size, 1000)
				if err := initiate(p, mode, size, 1000); err != nil {
					b.Fatal(err)
				}
				if err := <-done; err != nil {
					b.Fatal(err)
				}
				ref := refPingPong(b, p, size, b.N)
				done = respond(p, mode, size, b.N)
				b.ReportAllocs()
				b.ResetTimer()
				if err := initiate(p, mode, size, b.N); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				if err := <-done; err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(float64(b.Elapsed())/float64(ref), "x-C")
				b.ReportMetric(float64(ref.Nanoseconds())/float64(b.N), "C-ns/op")
			})
		}
	}
}
