package condition

import (
	"errors"
	"sync"

	"github.com/ucpx/ucpx/stream/streamcore"
	"github.com/ucpx/ucpx/trace"
)

// deviceStamps is a traced Stream condition's ring of device stamp slots (two words
// each: the device's clock when its stream reached a completion poll and when the poll
// ended), for streams whose polls stamp (streamcore.StampedPoller). A slot goes back to
// the ring once its stamps are in the recorder; when all are in use an operation goes
// unstamped rather than wait.
type deviceStamps struct {
	mu      sync.Mutex
	poller  streamcore.StampedPoller // the condition's stream
	block   *streamcore.WordBlock
	rec     *trace.Recorder
	track   uint64
	free    []int
	pending []stampUse // oldest first
	remove  func()     // unregisters the harvester from rec
}

type stampUse struct {
	slot int
	seq  uint64
}

// deviceStampSlots is the ring's size: polls are for long transfers, and a stream
// rarely has more than a few in flight.
const deviceStampSlots = 64

// stampsLocked returns the condition's stamp ring, made on first use (on the enqueuing
// goroutine, never the engine's) and stamping for rec, or nil: no recorder, a stream
// that does not stamp, or words that could not be had. Caller holds c.mu.
func (c *Condition) stampsLocked(rec *trace.Recorder) *deviceStamps {
	if rec == nil {
		return nil
	}
	poller, ok := c.stream.(streamcore.StampedPoller)
	if !ok {
		return nil
	}
	if c.stamps != nil {
		c.stamps.retarget(rec)
		return c.stamps
	}
	block, err := c.backend.AllocWords(2 * deviceStampSlots)
	if err != nil {
		return nil
	}
	st := &deviceStamps{poller: poller, block: block, rec: rec, track: c.id, free: make([]int, 0, deviceStampSlots)}
	for i := deviceStampSlots - 1; i >= 0; i-- {
		st.free = append(st.free, i)
	}
	st.remove = rec.AddHarvester(st.harvest)
	c.stamps = st
	return st
}

// pollLocked enqueues the completion poll of operation seq, stamped when traced.
// Caller holds c.mu.
func (c *Condition) pollLocked(seq uint64, rec *trace.Recorder) error {
	if st := c.stampsLocked(rec); st != nil {
		if w := st.take(seq); w != nil {
			err := st.poller.PollValueStamped(c.done, seq, w)
			if err == nil {
				return nil
			}
			st.untake()
			if !errors.Is(err, streamcore.ErrNotSupported) {
				return err
			}
		}
	}
	return c.stream.PollValue(c.done, seq)
}

// take hands out a slot for operation seq (nil if none is free).
func (st *deviceStamps) take(seq uint64) *streamcore.Word {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.harvestLocked()
	if len(st.free) == 0 {
		return nil
	}
	slot := st.free[len(st.free)-1]
	st.free = st.free[:len(st.free)-1]
	st.pending = append(st.pending, stampUse{slot, seq})
	return st.block.Word(2 * slot)
}

// untake returns the slot take handed out last (its poll was not enqueued).
func (st *deviceStamps) untake() {
	st.mu.Lock()
	defer st.mu.Unlock()
	last := st.pending[len(st.pending)-1]
	st.pending = st.pending[:len(st.pending)-1]
	st.free = append(st.free, last.slot)
}

// harvest moves every finished poll's stamps into the recorder (the recorder calls it
// before it writes).
func (st *deviceStamps) harvest() {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.harvestLocked()
}

// harvestLocked looks at every slot in use, not only up to the first unstamped one: a
// poll whose stream failed before it ran never stamps, and must not hold back the rest.
func (st *deviceStamps) harvestLocked() {
	if st.block.Closed() {
		return
	}
	left := st.pending[:0]
	for _, u := range st.pending {
		arrived, released := st.block.Word(2*u.slot), st.block.Word(2*u.slot+1)
		end := released.Load() // stored last, with release semantics
		if end == 0 {
			left = append(left, u)
			continue
		}
		st.rec.AddDeviceSpan(st.track, u.seq, arrived.Load(), end)
		arrived.Store(0)
		released.Store(0)
		st.free = append(st.free, u.slot)
	}
	st.pending = left
}

// retarget hands the ring to rec, the engine's recorder now: what the device stamped
// so far goes to the earlier one, polls still in flight stamp for rec. The ring stays:
// the stream may not have run them yet, so its words cannot be freed before Destroy.
func (st *deviceStamps) retarget(rec *trace.Recorder) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.rec == rec {
		return
	}
	st.harvestLocked()
	st.remove()
	st.rec, st.remove = rec, rec.AddHarvester(st.harvest)
}

// takeStampsLocked detaches the condition's stamp ring (nil if none). Caller holds c.mu.
func (c *Condition) takeStampsLocked() *deviceStamps {
	st := c.stamps
	c.stamps = nil
	return st
}

// close harvests what the stream stamped and frees the ring: call it once the stream
// ran every poll that uses it.
func (st *deviceStamps) close() {
	if st == nil {
		return
	}
	st.remove()
	st.mu.Lock()
	st.harvestLocked()
	_ = st.block.Close()
	st.mu.Unlock()
}
