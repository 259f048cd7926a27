package condition

import (
	"fmt"
	"sync"
	"sync/atomic"
)

// streamDepth counts the operations of every Stream condition on one CUDA stream that
// are armed and not retired. MaxPendingCUDA bounds the stream, not each condition: the
// conditions of several peers on one stream fill one queue of memops, and it is that
// queue the driver stops taking from when it is full.
type streamDepth struct {
	pending atomic.Int64
	key     uintptr // the stream's handle
	refs    int     // under depthsMu
}

var (
	depthsMu sync.Mutex
	// depths is keyed by the CUDA stream's handle, so two wrappers of one stream
	// (WrapCUDAStream) share a count.
	depths = map[uintptr]*streamDepth{}
)

// acquireDepth returns the count of the CUDA stream with handle h, made on first use.
func acquireDepth(h uintptr) *streamDepth {
	depthsMu.Lock()
	defer depthsMu.Unlock()
	d := depths[h]
	if d == nil {
		d = &streamDepth{key: h}
		depths[h] = d
	}
	d.refs++
	return d
}

// release drops a condition's hold on the count.
func (d *streamDepth) release() {
	depthsMu.Lock()
	defer depthsMu.Unlock()
	if d.refs--; d.refs == 0 {
		delete(depths, d.key)
	}
}

// reserve takes room for n operations, refusing with ErrStreamFull when the stream
// already has MaxPendingCUDA pending. An operation moved in parts counts every part and
// is taken while the stream has room for one, so no transfer is too large to enqueue.
func (d *streamDepth) reserve(n int) error {
	for {
		have := d.pending.Load()
		if have >= MaxPendingCUDA {
			return fmt.Errorf("arm: %d operations wait on the CUDA stream: %w", have, ErrStreamFull)
		}
		if d.pending.CompareAndSwap(have, have+int64(n)) {
			return nil
		}
	}
}

// reserveLocked is reserve for a condition (nil-safe: only Stream conditions on a CUDA
// stream count). Caller holds c.mu.
func (c *Condition) reserveLocked(n int) error {
	if c.depth == nil {
		return nil
	}
	return c.depth.reserve(n)
}

// unreserve gives back room taken for n operations that were not armed after all (or
// that retired).
func (c *Condition) unreserve(n int) {
	if c.depth != nil && n > 0 {
		c.depth.pending.Add(-int64(n))
	}
}
