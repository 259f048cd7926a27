// Package pingpong holds what the two stream-mode ping-pong benchmarks share
// (`ucpx perf --modes` in cmd/ucpx and BenchmarkGPUModes in tests/): checking a
// conditioned run through its requests' callbacks, arming a persistent kernel's
// iterations ahead within a bounded window, and the producer kernel's seeds.
package pingpong

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/ucpx/ucpx/condition"
	"github.com/ucpx/ucpx/ucp"
)

// Window bounds how many iterations the host arms ahead of the completed ones in the
// kernel mode (so a long run does not hold millions of Requests).
const Window = 1024

// StreamWindow bounds how many iterations the host enqueues ahead of the completed
// ones in the modes that run ahead of the stream, (b) and (c), the same for both.
// Deeper, a CUDA stream's queue fills and the enqueuing call blocks inside the driver,
// spinning a core on the GPU's queue state for the rest of the run; a host stream's
// queue would grow without bound, and with it the heap the garbage collector scans.
// (Until run 43 only (c) was bounded: (b) queued its whole run at the start, so its
// host thread sat idle while (c)'s kept enqueuing beside the stream.)
const StreamWindow = 128

// ErrCheck: a run finished but its outcome was wrong.
var ErrCheck = errors.New("stream mode check failed")

// ProducerBlocks is the grid of the +work producer (ucpx_test_fill, 256 threads a
// block) over size bytes: one block per 4 KiB, as a kernel sized to its data would
// be launched. (One block for every size made the producer itself the measurement at
// 64 KiB: a single block's byte stores into host memory.)
func ProducerBlocks(size int) uint32 { return uint32(max(1, (size+4095)/4096)) }

// WorkSeed is iteration i's producer seed. device.Pattern shifts the seed right by 7
// bits, so consecutive integers would give the same bytes.
func WorkSeed(i int) uint32 { return uint32(i) << 7 }

// Throttle keeps a host at most a window of iterations ahead of the completed ones.
type Throttle struct {
	done   atomic.Int64  // iterations completed
	window int           // iterations the host may run ahead of done
	adv    chan struct{} // capacity 1: done advanced by window/2
}

// NewThrottle returns a Throttle of window iterations (Window or StreamWindow).
func NewThrottle(window int) *Throttle {
	return &Throttle{window: window, adv: make(chan struct{}, 1)}
}

// Done records one completed iteration (called where it completes: a callback, a host
// function on the stream). It wakes the host every half window, not every iteration:
// waking a goroutine costs the completing thread a system call.
func (t *Throttle) Done() {
	if t.done.Add(1)%int64(max(t.window/2, 1)) == 0 {
		select {
		case t.adv <- struct{}{}:
		default:
		}
	}
}

// Completed is the number of Done calls so far.
func (t *Throttle) Completed() int64 { return t.done.Load() }

// Ahead blocks while iteration i (counting from 0) would run the window or more ahead
// of the completed ones.
func (t *Throttle) Ahead(ctx context.Context, i, count int) error {
	for i-int(t.done.Load()) >= t.window {
		if err := t.advanced(ctx, count); err != nil {
			return err
		}
	}
	return nil
}

// advanced waits for the completed iterations to advance by half a window.
func (t *Throttle) advanced(ctx context.Context, count int) error {
	select {
	case <-t.adv:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%w after %d of %d iterations", context.Cause(ctx), t.done.Load(), count)
	}
}

// Check verifies a conditioned run through the requests' callbacks (run by the proxy
// as each operation retires): every send and receive succeeded and every receive got
// size bytes. Each retired send completes an iteration of its Throttle.
type Check struct {
	size  int
	recvs atomic.Int64 // retired with size bytes and no error
	bad   atomic.Pointer[string]
	Throttle
}

// NewCheck returns a Check for messages of size bytes whose host runs at most window
// iterations ahead (Window or StreamWindow).
func NewCheck(size, window int) *Check {
	return &Check{size: size, Throttle: Throttle{window: window, adv: make(chan struct{}, 1)}}
}

// Params are the request parameters of a run's sends and receives on cond. The memory
// handles and the peer may be nil.
func (c *Check) Params(cond *condition.Condition, sendMem, recvMem *ucp.MemH, peer *ucp.Endpoint) (send, recv *ucp.RequestParam) {
	send = &ucp.RequestParam{Condition: cond, MemH: sendMem, Callback: c.sent}
	recv = &ucp.RequestParam{Condition: cond, MemH: recvMem, Peer: peer, Callback: c.received}
	return send, recv
}

func (c *Check) sent(r *ucp.Request) {
	if err := r.Err(); err != nil {
		c.fail(fmt.Sprintf("send: %v", err))
	}
	c.Done()
}

func (c *Check) received(r *ucp.Request) {
	switch {
	case r.Err() != nil:
		c.fail(fmt.Sprintf("receive: %v", r.Err()))
	case r.Length() != c.size:
		c.fail(fmt.Sprintf("received %d bytes, want %d", r.Length(), c.size))
	default:
		c.recvs.Add(1)
	}
}

func (c *Check) fail(msg string) { c.bad.CompareAndSwap(nil, &msg) }

// Verify runs once cond has retired every operation of count iterations.
func (c *Check) Verify(cond *condition.Condition, count int) error {
	if msg := c.bad.Load(); msg != nil {
		return fmt.Errorf("%w: %s", ErrCheck, *msg)
	}
	if err := cond.Err(); err != nil {
		return err
	}
	if s, r := c.Completed(), c.recvs.Load(); s != int64(count) || r != int64(count) {
		return fmt.Errorf("%w: %d sends and %d receives completed, want %d of each", ErrCheck, s, r, count)
	}
	return nil
}

// ArmAhead arms iterations 1..count-1 with arm (iteration 0 is armed before the kernel
// starts, for its handle), never more than the window beyond the completed sends. The
// kernel may trigger an iteration before it is armed: the proxy issues an operation
// whose sequence number the trigger word has already passed as soon as it is armed.
func (c *Check) ArmAhead(ctx context.Context, count int, arm func() error) error {
	for armed := 1; armed < count; {
		for ; armed < count && armed-int(c.Completed()) < c.window; armed++ {
			if err := arm(); err != nil {
				return err
			}
		}
		if armed < count {
			if err := c.advanced(ctx, count); err != nil {
				return err
			}
		}
	}
	return nil
}
