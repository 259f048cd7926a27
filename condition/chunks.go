package condition

import (
	"fmt"

	"github.com/ucpx/ucpx/stream/streamcore"
)

// armChunks arms one operation made of len(work) parts with consecutive sequence
// numbers, on a Stream condition, so that their staging copies pipeline with the
// transfers (a large device buffer staged through pinned host memory):
//
//   - parts with work before their trigger (copies out) each get their own trigger
//     store right after their copy, so part i moves while part i+1 is copied;
//   - otherwise one trigger store starts every part at once;
//   - with streamOrdered, the stream waits for each part that has work after its
//     completion (a copy in) just before that work, so part i is copied in while
//     later parts still move, and in any case for the last part.
//
// record runs for each part once its trigger is enqueued (before any of the waits).
// armed is how many parts were armed: those will run. An error with armed < len(work)
// means the stream refused a trigger; with armed == len(work), a wait or work after
// completion was not enqueued. Not within a group (ErrInvalidParam): a group has one
// trigger for all its operations.
func (c *Condition) armChunks(streamOrdered bool, work []streamWork, record func(part int, seq uint64)) (armed int, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.destroyed.Load():
		return 0, fmt.Errorf("arm: %w", ErrDestroyed)
	case c.category != Stream:
		return 0, fmt.Errorf("arm parts on a %v condition: %w", c.category, ErrInvalidParam)
	case c.group != nil:
		return 0, fmt.Errorf("arm parts within a group: %w", ErrInvalidParam)
	case len(work) == 0:
		return 0, fmt.Errorf("arm no parts: %w", ErrInvalidParam)
	}
	if err := c.reserveLocked(len(work)); err != nil {
		return 0, err
	}
	defer func() { c.unreserve(len(work) - armed) }() // parts not armed give their room back
	first := c.armed + 1
	last := c.armed + uint64(len(work))
	eachTrigger := false
	for _, w := range work {
		eachTrigger = eachTrigger || w.before != nil
	}
	if eachTrigger {
		for i, w := range work {
			if w.before != nil {
				if err := w.before(c.stream); err != nil {
					return armed, fmt.Errorf("arm part %d: enqueue work before the trigger: %w", i, err)
				}
			}
			seq := first + uint64(i)
			if err := c.stream.WriteValue(c.trigger, seq); err != nil {
				if w.before != nil {
					// The copy into its staging buffer is enqueued: the buffer goes
					// back once the stream has passed it.
					c.giveBackLocked(w.part.takeUnused())
				}
				return armed, fmt.Errorf("arm part %d: enqueue trigger: %w", i, err)
			}
			record(i, seq)
			c.armed = seq
			armed++
		}
	} else {
		if err := c.stream.WriteValue(c.trigger, last); err != nil {
			return 0, fmt.Errorf("arm: enqueue trigger: %w", err)
		}
		for i := range work {
			record(i, first+uint64(i))
		}
		c.armed = last
		armed = len(work)
	}
	c.retryHeldLocked()
	if !streamOrdered {
		return armed, nil
	}
	for i, w := range work {
		if w.after == nil && i < len(work)-1 {
			continue
		}
		if err := c.stream.WaitValue(c.done, first+uint64(i), streamcore.GEQ); err != nil {
			return armed, fmt.Errorf("arm part %d: enqueue completion wait: %w", i, err)
		}
		if w.after != nil {
			if err := c.afterLocked(w.part, w.after); err != nil {
				return armed, fmt.Errorf("arm part %d: enqueue work after completion: %w", i, err)
			}
		}
	}
	return armed, nil
}
