// Package runahead bounds how far a benchmark's host runs ahead of a stream or a
// persistent kernel: the three mode benchmarks (`ucpx perf --modes`,
// tests.BenchmarkGPUModes and ucp.BenchmarkConditionModes) keep the same windows
// through it. It depends on nothing of ucpx, so package ucp's own tests can use it.
package runahead

import (
	"context"
	"fmt"
	"sync/atomic"
)

// KernelWindow bounds how many iterations the host arms ahead of the completed ones
// in the kernel mode (so a long run does not hold millions of Requests).
const KernelWindow = 1024

// StreamWindow bounds how many iterations the host enqueues ahead of the completed
// ones in the modes that run ahead of the stream, (b) and (c), the same for both.
// Deeper, a CUDA stream's queue fills and the enqueuing call blocks inside the driver,
// spinning a core on the GPU's queue state for the rest of the run; a host stream's
// queue would grow without bound, and with it the heap the garbage collector scans.
// Both modes share it so that neither gets an idle host thread the other lacks.
const StreamWindow = 128

// Throttle keeps a host at most a window of iterations ahead of the completed ones.
type Throttle struct {
	done   atomic.Int64  // iterations completed
	window int           // iterations the host may run ahead of done
	adv    chan struct{} // capacity 1: done advanced by window/2
}

// New returns a Throttle of window iterations (KernelWindow or StreamWindow).
func New(window int) *Throttle {
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

// ArmAhead arms iterations 1..count-1 with arm (iteration 0 is armed before the kernel
// starts, for its handle), never more than the window beyond the completed ones. The
// kernel may trigger an iteration before it is armed: the proxy issues an operation
// whose sequence number the trigger word has already passed as soon as it is armed.
func (t *Throttle) ArmAhead(ctx context.Context, count int, arm func() error) error {
	for armed := 1; armed < count; armed++ {
		if err := t.Ahead(ctx, armed, count); err != nil {
			return err
		}
		if err := arm(); err != nil {
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
