package prepare

import (
	"context"
	"time"
)

// The mover: MPI's Pready does not wait, and a partition made ready before the
// receiver's readiness of its iteration lands must still move once it lands, even if
// the application calls nothing more on the request (no Test, no Wait) and runs no
// progress loop of its own. Each such sender is handed to its worker's registry,
// whose mover takes the partitions as the readiness lands and progresses the worker
// until their puts completed.

// waitingIter is a sender's iteration with readied partitions waiting for the
// receiver, since when.
type waitingIter struct {
	iter  uint64
	since time.Time
}

// awaitReady hands the mover sender r, whose Pready left partitions of iteration iter
// waiting for the receiver's readiness. The mover starts only drainDelay later, like
// the drainer: an application that goes on to Test or Wait moves them itself, and a
// loop of iterations pays no goroutine and no progress round beside its own (which
// would take the readiness in the middle of its Pready calls and move the partitions
// one by one instead of together). Caller holds r.mu.
func (g *registry) awaitReady(r *Request, iter uint64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.waiters == nil {
		g.waiters = map[*Request]waitingIter{}
	}
	g.waiters[r] = waitingIter{iter, time.Now()}
	if !g.moving {
		g.moving = true
		time.AfterFunc(drainDelay, g.moveLater)
	}
}

// watchSent hands the mover sender r, a stream of which waits (WaitOnStream) for
// every partition of iteration iter to move: the mover runs at once, and until then.
// Caller holds r.mu.
func (g *registry) watchSent(r *Request, iter uint64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.waiters == nil {
		g.waiters = map[*Request]waitingIter{}
	}
	g.waiters[r] = waitingIter{iter: iter} // waited since ever: late at once
	if !g.moving {
		g.moving = true
		go g.mover()
	}
}

// moveLater is the mover's delayed start: it runs once some sender's partitions
// waited drainDelay; younger ones get their delay.
func (g *registry) moveLater() {
	if left, late, _ := g.pumpWaiters(); left > 0 {
		g.moveOrWait(late)
	}
}

// moveOrWait runs the mover while some sender's partitions waited drainDelay, and
// otherwise looks again after the delay.
func (g *registry) moveOrWait(late bool) {
	if late {
		g.mover()
		return
	}
	time.AfterFunc(drainDelay, g.moveLater)
}

// mover pumps the senders whose partitions waited drainDelay and progresses the
// worker (a readiness that a transport emulates with active messages lands only then,
// and so do the puts it issued) until none is left; a sender whose partitions wait
// less long is its application's to move, as in moveLater. Between rounds it sleeps
// on the worker's event fd, bounded: a readiness written into shared memory raises no
// event, so it is polled, less often the longer the receiver keeps the sender waiting.
func (g *registry) mover() {
	ctx := context.Background()
	bound := movePollMin
	for {
		left, late, moved := g.pumpWaiters()
		switch {
		case left == 0:
			return
		case !late:
			g.moveOrWait(false)
			return
		case moved || g.w.Progress() > 0:
			bound = movePollMin
			continue
		}
		if err := g.w.WaitForEvents(ctx, bound); err != nil {
			g.mu.Lock()
			g.waiters, g.moving = nil, false // the worker closed
			g.mu.Unlock()
			return
		}
		bound = min(2*bound, movePollMax)
	}
}

// movePollMin and movePollMax bound the mover's sleep between polls of the ready flags:
// every wake-up costs CPU, and the longest sleep bounds what a receiver that keeps the
// sender waiting costs it (docs/performance.md, "Idle waits").
const (
	movePollMin = 100 * time.Microsecond
	movePollMax = 10 * time.Millisecond
)

// pumpWaiters moves what it can of every sender that waited drainDelay and forgets
// those done with (see pumpWaiting). It reports how many senders are left (at none the
// mover is done: moving is cleared), whether one of them waited drainDelay, and
// whether anything moved.
func (g *registry) pumpWaiters() (left int, late, moved bool) {
	type pending struct {
		r *Request
		w waitingIter
	}
	// Requests lock their own mutex before the registry's (awaitReady): pump them with
	// the registry unlocked.
	g.mu.Lock()
	snap := make([]pending, 0, len(g.waiters))
	for r, w := range g.waiters {
		snap = append(snap, pending{r, w})
	}
	g.mu.Unlock()
	var done []pending
	for _, p := range snap {
		if time.Since(p.w.since) < drainDelay {
			continue
		}
		over, m := p.r.pumpWaiting(p.w.iter)
		moved = moved || m
		if over {
			done = append(done, p)
		} else {
			late = true
		}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, p := range done {
		if g.waiters[p.r].iter == p.w.iter {
			delete(g.waiters, p.r)
		}
	}
	if len(g.waiters) == 0 {
		g.moving = false
	}
	return len(g.waiters), late, moved
}

// pumpWaiting moves r's partitions of iteration iter whose readiness landed. It
// reports over once nothing of that iteration is left to the mover: every readied
// partition moved and its puts completed, or the application moved on (the iteration
// completed, a later one started), or r failed or was freed. A put refused at issue
// fails the iteration, which Test and Wait report.
func (r *Request) pumpWaiting(iter uint64) (over, moved bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.freed || r.err != nil || !r.active || r.iter != iter {
		return true, false
	}
	n := len(r.waiting)
	_ = r.pumpLocked()
	moved = len(r.waiting) < n
	if r.sentWatched == iter {
		// A stream waits until every partition moved (WaitOnStream), also those not
		// ready yet.
		if !r.sentLocked() {
			return false, moved
		}
		r.signalSentLocked()
		return true, moved
	}
	if len(r.waiting) > 0 {
		return false, moved
	}
	for _, req := range r.inflight {
		if !req.Done() {
			return false, moved
		}
	}
	return true, moved
}
