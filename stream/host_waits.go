package stream

import (
	"errors"
	"fmt"
	"sync"

	"github.com/ucpx/ucpx/internal/goid"
)

// Deadlock detection among host streams' executors. A host func runs on its stream's
// executor, so a host func that blocks in Synchronize, Event.Synchronize or Close of
// another host stream holds its own stream up meanwhile. If that other stream (or one
// it waits for, and so on) waits for the first one past the func, neither can ever
// move: a deadlock no Close grace ends (host funcs are never abandoned). Such a wait
// is refused instead, with an error wrapping ErrInvalidArgument; waits that form no
// cycle proceed as before.
//
// hostWaits is the wait-for graph: each executor blocked on another host stream (in a
// host func's call, or in its own WaitEvent op) has one edge to it. A wait is
// registered and checked under one mutex, so of two waits closing a cycle the second
// always sees the first. A cycle always holds a host func's call: WaitEvent waits for
// a position the event had when WaitEvent was called, which a stream cannot have
// reached by waiting on the first. When a stream's own WaitEvent closes a cycle, a
// host func's Synchronize in it is woken and refused. A Close in it cannot be (the
// stream is already closing): Close's grace then abandons the WaitEvent, as it does
// any wait that does not hold.
//
// Only waits that would park come here (the target not reached within awaitSpinFor's
// spin): finding the calling goroutine costs about a microsecond, and registering an
// edge takes the global mutex.
var hostWaits = struct {
	mu        sync.Mutex
	executors map[uint64]*hostStream // executor goroutine id -> its stream
	blocked   map[*hostStream]*waitEdge
}{
	executors: make(map[uint64]*hostStream),
	blocked:   make(map[*hostStream]*waitEdge),
}

// waitEdge is one executor's wait for position target of on (^uint64(0): for on's
// executor to exit, Close).
type waitEdge struct {
	on     *hostStream
	target uint64
	// stop, when not nil, is closed to refuse the wait after it began (a host func's
	// Synchronize or Event.Synchronize that a WaitEvent op closed a cycle on).
	stop    chan struct{}
	refused bool // under hostWaits.mu
}

// registerExecutor records goroutine id as s's executor; unregisterExecutor forgets it.
func registerExecutor(id uint64, s *hostStream) {
	hostWaits.mu.Lock()
	hostWaits.executors[id] = s
	hostWaits.mu.Unlock()
}

func unregisterExecutor(id uint64) {
	hostWaits.mu.Lock()
	delete(hostWaits.executors, id)
	hostWaits.mu.Unlock()
}

// callingExecutor returns the host stream whose executor is the calling goroutine
// (the caller is one of its host funcs), or nil.
func callingExecutor() *hostStream {
	id := goid.Current()
	hostWaits.mu.Lock()
	defer hostWaits.mu.Unlock()
	return hostWaits.executors[id]
}

// errWaitCycle is what a wait that would close a cycle returns.
func errWaitCycle(what string, from, on *hostStream) error {
	return fmt.Errorf("stream: host %s called from a host func of stream %p waits for stream %p, which waits for that func "+
		"(a deadlock; host funcs should not wait for streams): %w", what, from, on, ErrInvalidArgument)
}

// beginWait registers from's wait for position target of on. If the wait would close
// a cycle and refuse is set, it registers nothing and returns false. If a cycle closes
// anyway (an executor's WaitEvent), an interruptible host func's wait in the cycle is
// refused instead. interruptible gives the edge a stop channel.
func beginWait(from, on *hostStream, target uint64, refuse, interruptible bool) (*waitEdge, bool) {
	e := &waitEdge{on: on, target: target}
	if interruptible {
		e.stop = make(chan struct{})
	}
	hostWaits.mu.Lock()
	defer hostWaits.mu.Unlock()
	if cycle, ok := waitCycle(from, on, target); ok {
		if refuse {
			return nil, false
		}
		for _, c := range cycle {
			if c.stop != nil && !c.refused {
				c.refused = true
				close(c.stop)
				break
			}
		}
	}
	hostWaits.blocked[from] = e
	return e, true
}

// wouldCycle reports whether from waiting for s to exit (Close) would close a cycle.
func wouldCycle(from, s *hostStream) bool {
	hostWaits.mu.Lock()
	defer hostWaits.mu.Unlock()
	_, ok := waitCycle(from, s, ^uint64(0))
	return ok
}

// endWait removes the edge beginWait registered; it reports whether the wait was
// refused after it began.
func endWait(from *hostStream, e *waitEdge) (refused bool) {
	hostWaits.mu.Lock()
	defer hostWaits.mu.Unlock()
	if hostWaits.blocked[from] == e {
		delete(hostWaits.blocked, from)
	}
	return e.refused
}

// waitCycle reports whether from waiting for position target of on closes a cycle, and
// the edges on it after that wait. Called under hostWaits.mu. A stream already past
// the position waited for, or exited, breaks the chain; so does one not blocked on a
// host stream (it may still move).
func waitCycle(from, on *hostStream, target uint64) ([]*waitEdge, bool) {
	var path []*waitEdge
	for cur, tgt := on, target; len(path) <= len(hostWaits.blocked); {
		if cur.completed.Load() >= tgt || cur.exited() {
			return nil, false
		}
		if cur == from {
			return path, true
		}
		e := hostWaits.blocked[cur]
		if e == nil || e.refused {
			return nil, false
		}
		path = append(path, e)
		cur, tgt = e.on, e.target
	}
	return nil, false // a cycle not through from: it was refused when it closed
}

// exited reports whether the executor has exited.
func (s *hostStream) exited() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

// callerWait waits for position target of s for a call from outside the stream's
// own ops (Synchronize, Event.Synchronize): the wait's result (see reached) is err.
// Called from a host func, it refuses (refused, err nil) a wait that could never end:
// on the func's own stream, or one closing a cycle of host streams waiting for each
// other. Such a wait cannot settle while it spins, so the caller is looked up only
// when the spin did not settle it, before parking.
func (s *hostStream) callerWait(what string, target uint64) (refused, err error) {
	if ok, err := s.spinSeq(target); ok {
		return nil, err
	}
	from := callingExecutor()
	if from == nil {
		return nil, s.parkSeq(target, nil, nil)
	}
	if from == s {
		return errOwnExecutor(what), nil
	}
	e, ok := beginWait(from, s, target, true, true)
	if !ok {
		return errWaitCycle(what, from, s), nil
	}
	err = s.parkSeq(target, e.stop, nil)
	if endWait(from, e) && errors.Is(err, errStopped) {
		return errWaitCycle(what, from, s), nil
	}
	return nil, err
}
