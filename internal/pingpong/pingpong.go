// Package pingpong holds what the two stream-mode ping-pong benchmarks share
// (`ucpx perf --modes` in cmd/ucpx and BenchmarkGPUModes in tests/): checking a
// conditioned run through its requests' callbacks (whose sends pace the run-ahead, see
// package runahead) and the producer kernel's seeds.
package pingpong

import (
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/ucpx/ucpx/condition"
	"github.com/ucpx/ucpx/internal/runahead"
	"github.com/ucpx/ucpx/ucp"
)

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

// Check verifies a conditioned run through the requests' callbacks (run by the proxy
// as each operation retires): every send and receive succeeded and every receive got
// size bytes. Each retired send completes an iteration of its Throttle.
type Check struct {
	size  int
	recvs atomic.Int64 // retired with size bytes and no error
	bad   atomic.Pointer[string]
	*runahead.Throttle
}

// NewCheck returns a Check for messages of size bytes whose host runs at most window
// iterations ahead (runahead.KernelWindow or runahead.StreamWindow).
func NewCheck(size, window int) *Check {
	return &Check{size: size, Throttle: runahead.New(window)}
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

// callbackGrace bounds how long Verify waits for callbacks still running.
const callbackGrace = time.Second

func (c *Check) fail(msg string) { c.bad.CompareAndSwap(nil, &msg) }

// Verify runs once cond has retired every operation of count iterations. An
// operation's callback runs right after its completion store, which is what released
// the caller (a stream's synchronize), so the last callbacks may still be running:
// Verify gives them callbackGrace before it counts.
func (c *Check) Verify(cond *condition.Condition, count int) error {
	for deadline := time.Now().Add(callbackGrace); c.Completed() < int64(count) || c.recvs.Load() < int64(count); {
		if c.bad.Load() != nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Microsecond)
	}
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
