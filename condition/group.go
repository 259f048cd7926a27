package condition

import (
	"fmt"

	"github.com/ucpx/ucpx/stream/streamcore"
	"github.com/ucpx/ucpx/trace"
)

// Groups: operations armed on a Stream condition between BeginGroup and EndGroup share
// one trigger and one completion wait, enqueued by EndGroup, as ncclGroupStart/End
// batch NCCL calls or MPI_Startall starts several requests. The stream reaches all of
// them together at EndGroup's point, the engine issues them in sequence order, and with
// any of them stream-ordered the stream waits once, until all completed (the
// completion word is contiguous). On CUDA an n-operation group costs two memops
// enqueued in one driver call instead of two per operation.

type group struct {
	last    uint64 // sequence number armed last before the group began
	ordered bool   // some operation asked for stream-ordered completion
	polled  bool   // some stream-ordered operation asked to poll for completion
	after   []groupAfter
	// staged: the group's staged parts, whose buffers go back once EndGroup let go of
	// them (settleGroupLocked): the copies into them were enqueued before the trigger.
	staged []*part
	trace  *trace.Recorder // the recorder of a traced operation of the group
}

// groupAfter is the work after an operation's completion, which EndGroup enqueues.
type groupAfter struct {
	work func(s streamcore.Stream) error
	part *part
}

// BeginGroup opens a group on a Stream condition. Operations armed until EndGroup,
// from any goroutine, join it.
func (c *Condition) BeginGroup() error {
	if c == nil {
		return fmt.Errorf("begin group: nil condition: %w", ErrInvalidParam)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.destroyed.Load():
		return fmt.Errorf("begin group: %w", ErrDestroyed)
	case c.category != Stream:
		return fmt.Errorf("begin group on a %v condition: %w", c.category, ErrInvalidParam)
	case c.group != nil:
		return fmt.Errorf("begin group: a group is already open: %w", ErrInvalidParam)
	}
	after, staged := c.groupBuf.after[:0], c.groupBuf.staged[:0]
	clear(c.groupBuf.after)
	clear(c.groupBuf.staged)
	c.groupBuf = group{last: c.armed, after: after, staged: staged}
	c.group = &c.groupBuf
	return nil
}

// inGroup reports whether a group is open.
func (c *Condition) inGroup() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.group != nil
}

// EndGroup enqueues the group's trigger and, if any of its operations is
// stream-ordered, its completion wait and the work that follows it (copies of staged
// receives). If the stream refuses the trigger, the operations are started from the
// host instead, so none is left waiting for a trigger that never comes, and the error
// is returned (and kept in Err); their staging buffers go back once they completed and
// the stream passed the copies into them. While the stream captures a graph a group
// with operations is not ended (ErrInvalidParam, as RecordEvent): its trigger would be
// captured rather than run; it stays open, and EndGroup after EndCapture ends it.
func (c *Condition) EndGroup() error {
	if c == nil {
		return fmt.Errorf("end group: nil condition: %w", ErrInvalidParam)
	}
	c.mu.Lock()
	kick, err := c.endGroupLocked()
	c.mu.Unlock()
	if kick {
		// Outside c.mu: the kick may run the engine's round here, and with it the
		// operations' callbacks.
		c.words.Kick()
	}
	return err
}

// endGroupLocked is EndGroup under c.mu; kick: the trigger was stored from the host.
func (c *Condition) endGroupLocked() (kick bool, err error) {
	g := c.group
	if g == nil {
		return false, fmt.Errorf("end group: no group is open: %w", ErrInvalidParam)
	}
	if c.destroyed.Load() { // destroyed with the group open and empty
		c.group = nil
		return false, fmt.Errorf("end group: %w", ErrDestroyed)
	}
	if c.armed == g.last {
		c.group = nil
		return false, nil // an empty group enqueues nothing
	}
	// Under stream capture the group's trigger and completion wait would go into the
	// captured graph, not onto the live stream: its operations, armed before the
	// capture with the condition's sequence numbers, would never be triggered (and a
	// relaunched graph would store a number that is not its own). As RecordEvent, it
	// is refused; the group stays open for an EndGroup after EndCapture. A stream that
	// cannot tell is taken as not capturing: the enqueue below then fails and the
	// trigger is stored from the host, so the operations still run.
	if capturing, err := c.stream.Capturing(); err == nil && capturing {
		return false, fmt.Errorf("end group while the stream captures a graph (its operations were armed on the live stream: end the group after EndCapture): %w", ErrInvalidParam)
	}
	c.group = nil
	// Whatever is left unsettled below (the stream refused the trigger, the wait or
	// work after it) goes back once the stream passed what was enqueued.
	defer c.settleGroupLocked(g)
	if g.ordered && !g.polled {
		err = c.stream.WriteThenWait(c.trigger, c.armed, c.done, c.armed, streamcore.GEQ)
	} else {
		err = c.stream.WriteValue(c.trigger, c.armed)
	}
	if err != nil {
		err = fmt.Errorf("end group: enqueue trigger: %w", err)
		c.recordErr(err, "group")
		c.settleGroupLocked(g) // before the operations can start
		c.trigger.Store(c.armed)
		return true, err
	}
	// The copies into outgoing parts' buffers precede the trigger: each goes back when
	// its part retires, as planned.
	for _, p := range g.staged {
		if p.plan.After == nil {
			p.settle(p.plan.Release)
		}
	}
	if g.polled {
		if err := c.pollLocked(c.armed, g.trace); err != nil {
			return false, fmt.Errorf("end group: enqueue completion wait: %w", err)
		}
	}
	for _, after := range g.after {
		if err := c.afterLocked(after.part, after.work); err != nil {
			return false, fmt.Errorf("end group: enqueue work after completion: %w", err)
		}
	}
	return false, nil
}

// settleGroupLocked lets go of the group's staged parts not let go of yet: their
// buffers go back once the stream has passed the work enqueued so far (the copies into
// them) and the parts retired. Caller holds c.mu.
func (c *Condition) settleGroupLocked(g *group) {
	for i, p := range g.staged {
		if p.held && !p.settled {
			p.settled = true
			p.hold.give = p.takeUnused()
			c.giveBackLocked(p.hold.let)
		}
		g.staged[i] = nil
	}
	g.staged = g.staged[:0]
}

// armGroupLocked arms one operation of the open group (arm enqueued its work before
// the trigger); the rest is enqueued at EndGroup. Caller holds c.mu.
func (c *Condition) armGroupLocked(streamOrdered bool, work streamWork, record func(seq uint64)) (uint64, error) {
	seq := c.armed + 1
	if p := work.part; p != nil && p.plan.Staged {
		// Its buffer goes back once EndGroup let go of it too.
		p.holdStaging()
		c.group.staged = append(c.group.staged, p)
	}
	record(seq)
	c.armed = seq
	if streamOrdered {
		c.group.ordered = true
		c.group.polled = c.group.polled || work.poll
		if work.trace != nil {
			c.group.trace = work.trace
		}
		if work.after != nil {
			c.group.after = append(c.group.after, groupAfter{work.after, work.part})
		}
	}
	return seq, nil
}
