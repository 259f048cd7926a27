package condition

import (
	"fmt"

	"github.com/ucpx/ucpx/stream/streamcore"
)

// Completion events: a framework hands its work to streams ucpx never sees (another
// library's, its own side streams) with cuStreamWaitEvent on an event; MPICH #7612's
// PyTorch backend records one right after enqueueing a receive. RecordEvent gives such
// an event: it enqueues on the condition's stream a wait until the completion word has
// reached the operation's sequence number, then records the event, so the event is
// ready only once the operation completed, whatever the stream is doing. Any stream of
// the process (or of another library) may then wait on the event.

// RecordEvent records ev on the condition's stream at a point the stream reaches only
// once every operation armed on the condition so far has completed. ev may wrap a raw
// CUevent (stream.WrapCUDAEvent). Work enqueued on the stream after it also waits for
// those operations, as it would with stream-ordered completion. Only Stream conditions
// have a stream; with a group open the group's operations are not triggered yet, so
// the call is refused (ErrInvalidParam) until EndGroup.
func (c *Condition) RecordEvent(ev streamcore.Event) error {
	if c == nil {
		return fmt.Errorf("record event: nil condition: %w", ErrInvalidParam)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.recordableLocked(ev); err != nil {
		return err
	}
	if c.group != nil && c.armed > c.group.last {
		return fmt.Errorf("record event: a group is open (its trigger comes at EndGroup): %w", ErrInvalidParam)
	}
	return c.recordAfterLocked(c.armed, ev)
}

// RecordEvent records ev on the operation's condition stream at a point reached only
// once this operation (and every one armed before it on the condition) has completed:
// a stream the library never saw can wait for the operation with cuStreamWaitEvent.
func (o *Op) RecordEvent(ev streamcore.Event) error {
	if o.cond == nil || o.seq == 0 {
		return fmt.Errorf("record event: operation not submitted: %w", ErrInvalidParam)
	}
	c := o.cond
	if c.category == Stream && c.stream.Kind() == streamcore.KindCUDA && !o.done.Load() {
		// As WaitOnStream: the memop wait is noticed sooner when the engine rings.
		// Not under c.mu (WaitOnStream takes the engine's lock alone too).
		o.ringOnCompletion()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.recordableLocked(ev); err != nil {
		return err
	}
	if c.group != nil && o.seq > c.group.last {
		return fmt.Errorf("record event for an operation of an open group (its trigger comes at EndGroup): %w", ErrInvalidParam)
	}
	return c.recordAfterLocked(o.seq, ev)
}

// recordableLocked checks that c has a stream ev can be recorded on. Caller holds c.mu.
func (c *Condition) recordableLocked(ev streamcore.Event) error {
	switch {
	case ev == nil:
		return fmt.Errorf("record event: nil event: %w", ErrInvalidParam)
	case c.destroyed.Load():
		return fmt.Errorf("record event: %w", ErrDestroyed)
	case c.category != Stream:
		// A graph operation completes inside its graph (add an event record node after
		// its WaitNode); a kernel-triggered one has no stream of the library's.
		return fmt.Errorf("record event on a %v condition (only stream conditions have a stream): %w", c.category, ErrInvalidParam)
	}
	// Under stream capture the wait would name a sequence number a relaunched graph
	// never sees again; captured operations complete inside their graph. EndGroup
	// refuses under capture for the same reason (group.go).
	if capturing, err := c.stream.Capturing(); err != nil || capturing {
		if err != nil {
			return fmt.Errorf("record event: %w", err)
		}
		return fmt.Errorf("record event while the stream captures a graph (record it in the graph after the operation): %w", ErrInvalidParam)
	}
	return nil
}

// recordAfterLocked enqueues the wait for seq and the record. Caller holds c.mu, so no
// other operation's trigger comes between them (it would not matter for correctness:
// the event would only be later).
func (c *Condition) recordAfterLocked(seq uint64, ev streamcore.Event) error {
	if seq > 0 {
		if err := c.stream.WaitValue(c.done, seq, streamcore.GEQ); err != nil {
			return fmt.Errorf("record event: enqueue completion wait: %w", err)
		}
	}
	if err := c.stream.Record(ev); err != nil {
		return fmt.Errorf("record event: %w", err)
	}
	return nil
}
