package prepare

import "time"

// The mover: MPI's Pready does not wait, and a partition made ready before the
// receiver's readiness of its iteration lands must still move once it lands, even if
// the application calls nothing more on the request (no Test, no Wait) and runs no
// progress loop of its own. Each such sender is handed to its worker's registry,
// whose mover takes the partitions as the readiness lands and progresses the worker
// until their puts completed.

// awaitReady hands the mover sender r, whose Pready left partitions of iteration iter
// waiting for the receiver's readiness. The mover starts only drainDelay later, like
// the drainer: an application that goes on to Test or Wait moves them itself, and a
// loop of iterations pays no goroutine and no progress round beside its own (which
// would take the readiness in the middle of its Pready calls and move the partitions
// one by one instead of together). Caller holds r.mu.
func (g *registry) awaitReady(r *Request, iter uint64) {
	g.watch(r, iterSince{iter, time.Now()}, false)
}

// watchSent hands the mover sender r, a stream of which waits (WaitOnStream) for
// every partition of iteration iter to move: the mover runs at once (the iteration
// waited "since ever"), and until then. Caller holds r.mu.
func (g *registry) watchSent(r *Request, iter uint64) {
	g.watch(r, iterSince{iter: iter}, true)
}

// watch records r's iteration it for the mover and starts the mover if it is not
// running or due: at once, or after drainDelay.
func (g *registry) watch(r *Request, it iterSince, now bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.waiters == nil {
		g.waiters = map[*Request]iterSince{}
	}
	g.waiters[r] = it
	if g.moving {
		return
	}
	g.moving = true
	if now {
		go g.mover()
	} else {
		time.AfterFunc(drainDelay, g.moveLater)
	}
}

// moveLater is the mover's delayed start: it runs once some sender's partitions
// waited drainDelay; younger ones get their delay.
func (g *registry) moveLater() {
	switch left, late, _ := g.pumpWaiters(); {
	case left > 0 && late:
		g.mover()
	case left > 0:
		time.AfterFunc(drainDelay, g.moveLater)
	}
}

// mover pumps the senders whose partitions waited drainDelay and progresses the
// worker (a readiness that a transport emulates with active messages lands only then,
// and so do the puts it issued) until none is left; a sender whose partitions wait
// less long is its application's to move, as in moveLater. Between rounds it sleeps
// on the worker's event fd, bounded: a readiness written into shared memory raises no
// event, so it is polled, less often the longer the receiver keeps the sender waiting.
func (g *registry) mover() {
	g.progressWhile(&g.waiters, &g.moving, movePollMin, movePollMax, func() (bool, bool) {
		left, late, moved := g.pumpWaiters()
		if left > 0 && !late {
			time.AfterFunc(drainDelay, g.moveLater) // only young ones left: look again after their delay
			return false, moved
		}
		return left > 0, moved
	})
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
	left = g.sweep(&g.waiters, &g.moving, func(r *Request, it iterSince) bool {
		if time.Since(it.since) < drainDelay {
			return false // the application's to move, for now
		}
		over, m := r.pumpWaiting(it.iter)
		moved = moved || m
		late = late || !over
		return over
	})
	return left, late, moved
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
	return r.readiedMovedLocked(), moved
}
