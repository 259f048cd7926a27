package ucp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/condition"
	"github.com/ucpx/ucpx/graph"
)

// Every way of driving one worker's engine at once, so that the hand-over of its rounds
// between the engine's goroutine and the goroutines that drive them (host-stream waits,
// host-graph launches, conditioned requests' Wait, kernel-triggered Test loops) is
// exercised with each of them arriving, sleeping and leaving while the others run: a
// lost wake-up hangs a style (the context's deadline fails the test), a wrong hand-over
// corrupts nothing but stalls, and every echo is checked byte for byte. Sizes cross the
// eager and rendezvous protocols, whose progress needs rounds after the issue. Over tcp
// and shared memory.
func TestEngineHandOverStress(t *testing.T) {
	pairs(t, func(t *testing.T, p *pair) {
		const rounds = 60
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		b := hostBackend(t)
		sizes := []int{8, 4096, 256 << 10}
		var wg sync.WaitGroup
		errc := make(chan error, 8)
		run := func(name string, f func() error) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := f(); err != nil {
					errc <- fmt.Errorf("%s: %w", name, err)
					cancel()
				}
			}()
		}
		// B echoes every style's messages back with plain blocking calls.
		for _, base := range []uint64{0x100, 0x200, 0x300, 0x400} {
			run(fmt.Sprintf("echo %#x", base), func() error {
				return echoTag(ctx, p.b, p.epB, 256<<10, base, base+1, rounds)
			})
		}
		// exchange arms round i's send of a fresh pattern to base and its echo's receive
		// from base+1 on c, and returns the message, the receive buffer and requests.
		exchange := func(c *condition.Condition, base uint64, i int) (msg, back []byte, sr, rr *Request, err error) {
			n := sizes[int(base>>8+uint64(i))%len(sizes)]
			msg, back = pattern(n, int64(base)<<16+int64(i)), make([]byte, n)
			if sr, err = p.epA.TagSendNbx(msg, base, &RequestParam{Condition: c}); err == nil {
				rr, err = p.a.TagRecvNbx(back, base+1, ^uint64(0), &RequestParam{Condition: c})
			}
			return msg, back, sr, rr, err
		}
		check := func(style string, i int, got, want []byte) error {
			if !bytes.Equal(got, want) {
				return fmt.Errorf("%s round %d: the echo of %d bytes differs", style, i, len(want))
			}
			return nil
		}

		// A host stream: each round's send and receive in a group, waited on the stream.
		run("stream", func() error {
			s, c := streamCondition(t, b)
			for i := 0; i < rounds; i++ {
				if err := c.BeginGroup(); err != nil {
					return err
				}
				msg, back, _, _, err := exchange(c, 0x100, i)
				if err != nil {
					return err
				}
				if err := c.EndGroup(); err != nil {
					return err
				}
				if err := s.Synchronize(); err != nil {
					return err
				}
				if err := check("stream", i, back, msg); err != nil {
					return err
				}
			}
			return c.Err()
		})

		// A host graph: a send node and a receive node, launched once per round.
		run("graph", func() error {
			g := graph.NewHost()
			sc, err := condition.Create(condition.Param{Category: condition.Graph, Backend: b, Graph: g})
			if err != nil {
				return err
			}
			rc, err := condition.Create(condition.Param{Category: condition.Graph, Backend: b, Graph: g})
			if err != nil {
				return err
			}
			msg, back := make([]byte, 4096), make([]byte, 4096)
			if _, err := p.epA.TagSendNbx(msg, 0x200, &RequestParam{Condition: sc}); err != nil {
				return err
			}
			if _, err := p.a.TagRecvNbx(back, 0x201, ^uint64(0), &RequestParam{Condition: rc}); err != nil {
				return err
			}
			x, err := g.Instantiate()
			if err != nil {
				return err
			}
			defer x.Close()
			s, err := b.NewStream()
			if err != nil {
				return err
			}
			defer s.Close()
			for i := 0; i < rounds; i++ {
				copy(msg, pattern(len(msg), int64(1000+i)))
				if err := x.Launch(s); err != nil {
					return err
				}
				if err := s.Synchronize(); err != nil {
					return err
				}
				if err := check("graph", i, back, msg); err != nil {
					return err
				}
			}
			return errors.Join(sc.Err(), rc.Err())
		})

		// Conditioned requests waited on the host (Request.Wait drives the engine).
		run("wait", func() error {
			_, c := streamCondition(t, b)
			for i := 0; i < rounds; i++ {
				msg, back, sr, rr, err := exchange(c, 0x300, i)
				if err != nil {
					return err
				}
				if err := errors.Join(rr.Wait(ctx), sr.Wait(ctx)); err != nil {
					return err
				}
				if err := check("wait", i, back, msg); err != nil {
					return err
				}
			}
			return c.Err()
		})

		// A kernel-triggered condition driven from the host: Trigger, then Test until done.
		run("kernel", func() error {
			c, err := condition.Create(condition.Param{Category: condition.KernelTriggered, Backend: b})
			if err != nil {
				return err
			}
			for i := 0; i < rounds; i++ {
				msg, back, _, _, err := exchange(c, 0x400, i)
				if err != nil {
					return err
				}
				h, err := c.DeviceHandle()
				if err != nil {
					return err
				}
				if err := condition.Trigger(h); err != nil {
					return err
				}
				for !condition.Test(h) {
					if ctx.Err() != nil {
						return fmt.Errorf("kernel round %d: %w", i, ctx.Err())
					}
					time.Sleep(time.Duration(i%3) * 20 * time.Microsecond) // Test now and then, or in a loop
				}
				if err := check("kernel", i, back, msg); err != nil {
					return err
				}
			}
			return c.Err()
		})

		wg.Wait()
		close(errc)
		for err := range errc {
			require.NoError(t, err)
		}
	})
}
