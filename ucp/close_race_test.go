package ucp

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/condition"
)

// Close while other goroutines keep calling: every call returns (done or an error
// of the vocabulary), none panics or hangs, the closing calls return, and the
// process's heap survives (both contexts close cleanly after). Each round closes a
// different object first.
func TestCloseWhileCalling(t *testing.T) {
	for _, first := range []string{"worker", "endpoint", "context", "memh"} {
		t.Run(first, func(t *testing.T) {
			p := newShmPair(t)
			mh, rk := mappedKey(t, p, 4096)
			hb := hostBackend(t)
			s, err := hb.NewStream()
			require.NoError(t, err)
			defer s.Close()
			cond, err := condition.Create(condition.Param{Category: condition.Stream, Backend: hb, Stream: s})
			require.NoError(t, err)

			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			var stop atomic.Bool
			var calls, failed atomic.Int64
			check := func(err error) {
				calls.Add(1)
				if err == nil {
					return
				}
				failed.Add(1)
				if !errors.Is(err, ErrClosed) && !errors.Is(err, ErrInvalidParam) && !errors.Is(err, ErrCanceled) &&
					!errors.Is(err, ErrConnectionReset) && !errors.Is(err, ErrPeerFailed) &&
					!errors.Is(err, ErrRevoked) && !errors.Is(err, condition.ErrClosed) && !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("unexpected error kind: %v", err)
				}
			}
			wait := func(r *Request, err error) {
				if err != nil {
					check(err)
					return
				}
				wctx, wcancel := context.WithTimeout(ctx, 5*time.Second)
				defer wcancel()
				check(r.Wait(wctx))
			}
			var wg sync.WaitGroup
			run := func(f func()) {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for !stop.Load() {
						f()
					}
				}()
			}
			out, in := make([]byte, 64), make([]byte, 64)
			run(func() { wait(p.epA.TagSendNbx(out, 5, nil)) })
			run(func() {
				rctx, rcancel := context.WithTimeout(ctx, 20*time.Millisecond)
				defer rcancel()
				_, _, err := p.b.TagRecv(rctx, in, 5, ^uint64(0))
				if errors.Is(err, context.DeadlineExceeded) {
					err = nil
				}
				check(err)
			})
			run(func() { wait(p.epA.FlushNbx(nil)) })
			run(func() {
				r, err := p.epA.TagSendNbx(out, 6, &RequestParam{Condition: cond, Flags: NonBlockingEnqueue})
				wait(r, err)
			})
			run(func() { check(p.a.WaitForEvents(ctx, time.Millisecond)) })
			run(func() { _ = p.a.Progress() })

			time.Sleep(200 * time.Millisecond)
			closed := make(chan error, 4)
			go func() {
				switch first {
				case "worker":
					closed <- p.a.Close()
				case "endpoint":
					closed <- p.epA.Close()
				case "context":
					closed <- p.ctxA.Close()
				case "memh":
					closed <- mh.Close()
				}
			}()
			select {
			case err := <-closed:
				require.NoError(t, err)
			case <-time.After(15 * time.Second):
				t.Fatalf("closing the %s while others call did not return", first)
			}
			time.Sleep(100 * time.Millisecond)
			stop.Store(true)
			done := make(chan struct{})
			go func() { wg.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(15 * time.Second):
				t.Fatalf("calls after closing the %s did not return", first)
			}
			require.Positive(t, calls.Load())
			if first != "memh" {
				require.Positive(t, failed.Load(), "calls after the close failed")
			}
			_ = cond.Destroy()
			_ = rk.Close()
			_ = mh.Close()
			// Both contexts close, the closed worker's included: a call that raced
			// with its Close once decremented a freed lock word, and the heap broke
			// under the next free (the other worker's destroy hung or crashed).
			// Puts and gets are left out: over shared memory into Go memory UCX 1.13
			// emulates them with active messages, and the target acknowledges each
			// put with a request whose datatype it never sets; pending to the closed
			// worker, that request is purged when the survivor is destroyed, and the
			// purge deregisters through the garbage datatype (a crash in most runs
			// of the whole suite; ucp_rma_sw_send_cmpl, UCX's bug).
			go func() {
				var errA error
				if first != "context" {
					errA = p.ctxA.Close()
				}
				closed <- errors.Join(errA, p.ctxB.Close())
			}()
			select {
			case err := <-closed:
				require.NoError(t, err)
			case <-time.After(30 * time.Second):
				t.Fatal("closing the contexts did not return")
			}
			p.ctxA, p.ctxB = nil, nil
		})
	}
}
