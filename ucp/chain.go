package ucp

import (
	"context"
	"errors"
	"runtime"
	"slices"
	"time"

	"github.com/ucpx/ucpx/cgo/ucx"
	"github.com/ucpx/ucpx/condition"
)

// Completion chains (condition.Chain) run in C: each operation is described once in C
// memory (ucpxu_chain_t), and the UCX completion callback that completes a step posts
// the next one, inside ucp_worker_progress. Go only starts a run and waits for its end,
// with the wait policy of Request.Wait (spin, then park on the event fd; the chain's
// end signals the worker when a waiter is parked and another goroutine's progress
// ended it). A ping-pong of chains costs what the same loop costs in C.

// chainRunner is the worker's side of one chain (condition.ChainRunner). Every read or
// call of raw holds w.mu and checks destroyed: Destroy frees raw under w.mu, and
// condition.Chain calls the runner without its own lock, so a call may race Destroy.
//
// A run has not ended while it runs in C or is paused for pulled messages (owed to
// their senders, maybe being copied into its buffers): Start, Running (Enqueue's and
// Then's check) and Destroy go by that (ongoingLocked).
//
// A condition.Chain dropped without Destroy is destroyed by a cleanup (dropped): its
// pins would otherwise outlive it (a runtime.Pinner collected while pinning is a
// fatal error) and its C side the worker.
type chainRunner struct {
	w   *Worker
	raw *ucx.Chain
	// Under w.mu.
	pin       runtime.Pinner
	pinned    bool
	parked    int
	destroyed bool
	// destroying: Destroy waits, outside w.mu, for the pulls of a paused run: nothing
	// starts, resumes or settles it meanwhile.
	destroying bool
	// pulling: the pulls of the receives a paused run waits for, by operation
	// (tagpull.go); the goroutine that waits on the run drives them.
	pulling map[int]*Request
	// bufs: each operation's buffer, in the C side's order.
	bufs [][]byte
	// eps: the endpoints the sends post on; a run starts only while all are open.
	eps []*Endpoint
}

// chainAdd enqueues a tag send (ep set) or receive into p.Chain.
func (w *Worker) chainAdd(op string, p *RequestParam, kind int, ep *Endpoint, buf []byte, tag, mask uint64) error {
	switch {
	case p.Callback != nil, p.Condition != nil, p.Request != nil, p.Peer != nil:
		return opErr(op, ErrInvalidParam, "RequestParam.Chain cannot go with Callback, Condition, Request or Peer")
	case p.Flags != 0:
		return opErr(op, ErrInvalidParam, "RequestParam.Chain: chained operations take no flags")
	}
	newRunner := func() (condition.ChainRunner, error) {
		w.mu.Lock()
		defer w.mu.Unlock()
		if w.closed.Load() {
			return nil, opErr(op, ErrClosed, "")
		}
		raw := w.raw.NewChain()
		if raw == nil {
			return nil, opErr(op, ErrNoMemory, "chain")
		}
		r := &chainRunner{w: w, raw: raw}
		// r does not reach the Chain: the cleanup runs once the Chain is dropped.
		runtime.AddCleanup(p.Chain, (*chainRunner).dropped, r)
		return r, nil
	}
	add := func(cr condition.ChainRunner, step int) error {
		r := cr.(*chainRunner)
		w.mu.Lock()
		defer w.mu.Unlock()
		if r.destroyed || r.raw.Detached() || w.closed.Load() {
			return opErr(op, ErrClosed, "chain's worker")
		}
		var rawEP *ucx.EP
		if ep != nil {
			if err := ep.usableLocked(op); err != nil {
				return err
			}
			rawEP = ep.raw
			if !slices.Contains(r.eps, ep) {
				r.eps = append(r.eps, ep)
			}
		}
		if err := statusErr(r.raw.Add(step, kind, rawEP, bufPtr(buf), len(buf), tag, mask, p.memType(), p.MemH.rawOrNil())); err != nil {
			return opErr(op, err, "chain step %d", step)
		}
		r.bufs = append(r.bufs, buf)
		if b := bufPtr(buf); b != nil && p.MemH == nil && !p.pinnedBuf {
			r.pin.Pin(b) // C keeps the address for the chain's life
			r.pinned = true
		}
		return nil
	}
	if err := p.Chain.Enqueue(w, newRunner, add); err != nil {
		return opErr(op, err, "chain")
	}
	return nil
}

// Start posts the first step (condition.ChainRunner).
func (r *chainRunner) Start(repeat uint64, keepGoing bool) error {
	w := r.w
	w.mu.Lock()
	if err := r.usableLocked("chain_start"); err != nil {
		w.mu.Unlock()
		return err
	}
	if r.ongoingLocked() {
		// Checked here, under w.mu, so that of two racing Starts one runs. A run
		// paused for pulls has not ended: starting over would drop the messages it
		// owes their senders.
		w.mu.Unlock()
		return opErr("chain_start", condition.ErrBusy, "running (or paused for pulled messages)")
	}
	for _, ep := range r.eps {
		// C holds the UCX endpoint: posting on one closed (or being closed) is
		// undefined in UCX.
		if err := ep.usableLocked("chain_start"); err != nil {
			w.mu.Unlock()
			return err
		}
	}
	st := r.raw.Start(repeat, keepGoing)
	w.afterCallUnlock()
	return opErr("chain_start", statusErr(st), "")
}

func (r *chainRunner) usableLocked(op string) error {
	switch {
	case r.destroyed:
		return opErr(op, condition.ErrDestroyed, "chain destroyed")
	case r.destroying:
		return opErr(op, condition.ErrDestroyed, "chain being destroyed")
	case r.w.closed.Load() || r.raw.Detached():
		return opErr(op, ErrClosed, "worker closed")
	}
	return nil
}

// ongoingLocked reports whether the run has not ended: it runs, or it is paused for
// pulled messages (pulls owed or being copied, or its resume not yet made). Caller
// holds w.mu; r is not destroyed.
func (r *chainRunner) ongoingLocked() bool {
	return r.destroying || r.raw.Running() || r.raw.Paused()
}

// Running reports whether a run has not ended (running, or paused for pulls).
func (r *chainRunner) Running() bool {
	r.w.mu.Lock()
	defer r.w.mu.Unlock()
	return !r.destroyed && r.ongoingLocked()
}

// Iterations completed by the current or last run (0 once destroyed, as
// condition.Chain.Iterations).
func (r *chainRunner) Iterations() uint64 {
	r.w.mu.Lock()
	defer r.w.mu.Unlock()
	if r.destroyed {
		return 0
	}
	n, _ := r.raw.Result()
	return n
}

// Err is the first error of the last run (nil once destroyed, as condition.Chain.Err).
func (r *chainRunner) Err() error {
	r.w.mu.Lock()
	defer r.w.mu.Unlock()
	if r.destroyed || r.ongoingLocked() {
		return nil
	}
	_, st := r.raw.Result()
	return opErr("chain", statusErr(st), "")
}

// endErr is the error of a run Wait or Test saw end: ErrDestroyed if Destroy came
// in between.
func (r *chainRunner) endErr(op string) error {
	r.w.mu.Lock()
	defer r.w.mu.Unlock()
	if r.destroyed {
		return opErr(op, condition.ErrDestroyed, "chain destroyed")
	}
	_, st := r.raw.Result()
	return opErr("chain", statusErr(st), "")
}

// OpErr is operation i's error in the last run (condition.ChainRunner).
func (r *chainRunner) OpErr(i int) error {
	w := r.w
	w.mu.Lock()
	defer w.mu.Unlock()
	if r.destroyed || i < 0 || i >= r.raw.Ops() {
		return nil
	}
	st, epClosed := r.raw.OpStatus(i)
	if st == ucx.ErrCanceled && epClosed {
		return opErr("chain", ErrClosed, "operation %d: its endpoint was closed", i)
	}
	return opErr("chain", statusErr(st), "operation %d", i)
}

// CancelOp cancels operation i if it is posted and pending (condition.ChainRunner).
func (r *chainRunner) CancelOp(i int) {
	w := r.w
	w.mu.Lock()
	if !r.destroyed && !w.closed.Load() && !r.raw.Detached() {
		r.raw.CancelOp(i)
		w.raw.Reap()
		w.afterLocked()
	}
	w.unlockDeferred()
}

// Test progresses once and reports whether the run ended.
func (r *chainRunner) Test() (bool, error) {
	w := r.w
	w.mu.Lock()
	if err := r.usableLocked("chain_test"); err != nil {
		w.mu.Unlock()
		return true, err
	}
	running := r.raw.Wait(1)
	_, st := r.raw.Result()
	paused := !running && r.raw.Paused()
	w.afterCallUnlock()
	if running {
		return false, nil
	}
	if paused {
		resumed, err := r.settlePulls(nil)
		if err != nil || resumed || r.paused() {
			return false, err
		}
		return true, r.endErr("chain_test")
	}
	return true, opErr("chain", statusErr(st), "")
}

// Wait drives progress until the run ends, with the wait policy of Request.Wait.
func (r *chainRunner) Wait(ctx context.Context) error {
	w := r.w
	done := ctx.Done()
	var start time.Duration
	started := false
	// The spin and yield clock restarts whenever the run moved: a chain waits for its
	// whole run, and only a run that stalls should yield the processor or park. The
	// chain's state is read under the lock of the progress call (Destroy may free it
	// once w.mu is let go).
	var last uint64 // a change on the first pass resets only what is already reset
	bound := parkBound{parkBoundMin}
	for i := 0; ; i++ {
		w.mu.Lock()
		if err := r.usableLocked("chain_wait"); err != nil {
			w.mu.Unlock()
			return err
		}
		running := r.raw.Wait(spinRounds)
		iters, st := r.raw.Result()
		paused := !running && r.raw.Paused()
		w.afterCallUnlock()
		if paused {
			resumed, err := r.settlePulls(ctx)
			if err != nil {
				return err
			}
			if !resumed {
				return r.endErr("chain_wait")
			}
			running = true
		}
		if !running {
			return opErr("chain", statusErr(st), "")
		}
		if done != nil {
			select {
			case <-done:
				return ctx.Err()
			default:
			}
		}
		if iters != last {
			last, started, i, bound.d = iters, false, 0, parkBoundMin
		}
		if i == 0 {
			continue
		}
		now := monotonic()
		if !started {
			start, started = now, true
			continue
		}
		if now-start >= yieldAfter {
			osYield()
		}
		if now-start < w.spinTime || w.efd < 0 {
			continue
		}
		parked := monotonic()
		if ended, err := r.park(ctx, bound.d); ended {
			return err
		}
		if bound.expired(parked) {
			start, i = monotonic()-w.spinTime, 1 // one progress pass, then park again
			continue
		}
		started, i = false, 0
	}
}

// paused reports whether the run stopped for pulled messages.
func (r *chainRunner) paused() bool {
	w := r.w
	w.mu.Lock()
	defer w.mu.Unlock()
	return !r.destroyed && !r.destroying && !r.raw.Detached() && !r.raw.Running() && r.raw.Paused()
}

// settlePulls pulls the data of the messages a paused run's receives got, then
// resumes the run; it reports whether it runs again. A nil ctx only starts the pulls
// and settles those that are done (Test).
func (r *chainRunner) settlePulls(ctx context.Context) (bool, error) {
	w := r.w
	w.mu.Lock()
	if err := r.usableLocked("chain_wait"); err != nil {
		w.mu.Unlock()
		return false, err
	}
	for i := 0; i < r.raw.Ops(); i++ {
		pulled, st, tag, n := r.raw.PullInfo(i)
		if !pulled || r.pulling[i] != nil || i >= len(r.bufs) {
			continue
		}
		q := &Request{w: w, op: "chain_recv"}
		q.setRecvBuf(w.ctx, r.bufs[i], 0)
		if r.pulling == nil {
			r.pulling = map[int]*Request{}
		}
		r.pulling[i] = q
		w.pullArrivedLocked(q, st, n, tag)
	}
	// A copy: another goroutine waiting on the same run settles pulls too, under
	// w.mu, while this one waits outside it.
	type pull struct {
		i int
		q *Request
	}
	pulls := make([]pull, 0, len(r.pulling))
	for i, q := range r.pulling {
		pulls = append(pulls, pull{i, q})
	}
	w.unlockDeferred()
	for _, pl := range pulls {
		i, q := pl.i, pl.q
		if ctx != nil {
			if err := q.Wait(ctx); err != nil && !q.Done() {
				return false, err
			}
		} else if done, _ := q.Test(); !done {
			continue
		}
		w.mu.Lock()
		if err := r.usableLocked("chain_wait"); err != nil {
			w.mu.Unlock() // Destroy settles it
			return false, err
		}
		st := ucx.OK
		if q.err != nil {
			st = ucx.ErrIOError
			var s Status
			if errors.As(q.err, &s) {
				st = ucx.Status(s)
			}
		}
		if r.pulling[i] == q { // not settled by another waiter meanwhile
			r.raw.Pulled(i, st, q.length)
			delete(r.pulling, i)
		}
		w.mu.Unlock()
	}
	w.mu.Lock()
	if len(r.pulling) > 0 {
		w.mu.Unlock()
		return false, nil
	}
	if err := r.usableLocked("chain_wait"); err != nil {
		w.mu.Unlock()
		return false, err
	}
	resumed := r.raw.Resume()
	w.afterCallUnlock()
	return resumed, nil
}

// park arms the worker and sleeps until the event fd fires (the chain's end signals it
// when another goroutine's progress ended the run), ctx ends, the worker closes or
// bound passes (parkBoundMin). It reports whether the wait is over.
func (r *chainRunner) park(ctx context.Context, bound time.Duration) (bool, error) {
	w := r.w
	w.mu.Lock()
	for try := 0; ; try++ {
		if err := r.usableLocked("chain_wait"); err != nil {
			w.mu.Unlock()
			return true, err
		}
		if !r.raw.Running() {
			w.mu.Unlock()
			return false, nil // ended or paused for pulls: Wait's loop tells which
		}
		if w.armLocked() == ucx.OK {
			break
		}
		r.raw.Wait(1)
		w.afterLocked()
		if try == parkTries-1 {
			w.afterCallUnlock()
			return false, nil
		}
	}
	r.parked++
	r.raw.SetParked(true)
	w.sleepUnlock(ctx, w.takeDeferredLocked(), time.Now().Add(bound))
	w.mu.Lock()
	r.parked--
	if !r.destroyed && !w.closed.Load() && !r.raw.Detached() { // Destroy ran while we slept
		r.raw.SetParked(r.parked > 0)
	}
	w.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return true, err
	}
	return false, nil
}

// IterationTimes converts the C side's iteration end stamps into durations.
func (r *chainRunner) IterationTimes() []time.Duration {
	w := r.w
	w.mu.Lock()
	defer w.mu.Unlock()
	if r.destroyed {
		return nil
	}
	ticks, perNs := r.raw.Times()
	if len(ticks) < 2 {
		return nil
	}
	out := make([]time.Duration, len(ticks)-1)
	for i := 1; i < len(ticks); i++ {
		out[i-1] = time.Duration(float64(ticks[i]-ticks[i-1]) / perNs)
	}
	return out
}

// chainStopFor bounds how long Destroy progresses a canceled run, and how long it
// waits for the pulls of a paused one.
const chainStopFor = 2 * time.Second

// Destroy stops a run and frees the chain: a running one's pending operations are
// canceled and completed (bounded); a paused one's pulled messages not yet pulled
// are answered as a receive too short for them answers (their sends complete,
// nothing is copied; the chain's operation fails with ErrCanceled), and the
// pulls already copying into its buffers are waited for (bounded): C and the copies
// keep the buffers until then. ErrBusy: something still holds the chain or its
// buffers, nothing was freed.
func (r *chainRunner) Destroy() error {
	w := r.w
	w.mu.Lock()
	if r.destroyed || r.destroying {
		w.mu.Unlock()
		return opErr("chain_destroy", ErrClosed, "")
	}
	if w.closed.Load() && !w.rawGone && !r.raw.Detached() {
		// The worker's Close let go of w.mu to run callbacks: UCX may hold the
		// chain's operations until the UCX worker goes, which cancels them.
		w.mu.Unlock()
		return opErr("chain_destroy", ErrBusy, "its worker is closing")
	}
	if !w.closed.Load() && !r.raw.Detached() && r.ongoingLocked() { // not destroying: checked above
		deadline := time.Now().Add(chainStopFor)
		for r.raw.Stop(4096) > 0 { // a paused run is marked stopped: never resumed
			if time.Now().After(deadline) {
				w.afterLocked()
				w.unlockDeferred()
				// UCX still holds operations pointing at the chain: keep its memory.
				return opErr("chain_destroy", ErrBusy, "operations did not complete after cancel")
			}
		}
		w.afterLocked()
		if r.raw.Paused() {
			if err := r.settleForDestroyLocked(deadline); err != nil {
				w.unlockDeferred()
				return err
			}
		}
	}
	r.destroyed = true
	r.raw.Free()
	if r.pinned {
		r.pin.Unpin()
		r.pinned = false
	}
	w.unlockDeferred()
	return nil
}

// settleForDestroyLocked ends a paused run's pulls before Destroy frees it: a
// message not yet pulled is answered as truncated (its sender's send completes, as
// for a receive too short for it; nothing is copied), and the pulls under way, whose
// copies write the chain's buffers and cannot be canceled, are waited for until
// deadline (outside w.mu: their progress needs it). Caller holds w.mu, held again on return; ErrBusy
// if a copy did not end.
func (r *chainRunner) settleForDestroyLocked(deadline time.Time) error {
	w := r.w
	for i := 0; i < r.raw.Ops(); i++ {
		pulled, _, tag, n := r.raw.PullInfo(i)
		if !pulled || r.pulling[i] != nil {
			continue
		}
		q := &Request{w: w, op: "chain_destroy"}
		w.pullArrivedLocked(q, ucx.ErrMessageTruncated, n, tag) // owes the truncation answer
		r.raw.Pulled(i, ucx.ErrCanceled, 0)
	}
	if len(r.pulling) == 0 {
		return nil
	}
	pulls := make(map[int]*Request, len(r.pulling))
	for i, q := range r.pulling {
		pulls[i] = q
	}
	r.destroying = true
	w.unlockDeferred()
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	for _, q := range pulls {
		_ = q.Wait(ctx)
	}
	cancel()
	w.mu.Lock()
	r.destroying = false
	for i, q := range pulls {
		if !q.Done() {
			return opErr("chain_destroy", ErrBusy, "a pulled message was still being copied into operation %d's buffer", i)
		}
		if r.pulling[i] == q { // not settled by a waiter meanwhile
			r.raw.Pulled(i, ucx.ErrCanceled, 0)
			delete(r.pulling, i)
		}
	}
	return nil
}

// dropped destroys the runner of a condition.Chain collected without Destroy (a
// cleanup). One that something still holds (ErrBusy) is kept on its worker and
// released at the worker's Close, after which nothing holds it.
func (r *chainRunner) dropped() {
	w := r.w
	for {
		if err := r.Destroy(); !errors.Is(err, ErrBusy) {
			return
		}
		w.mu.Lock()
		if !w.rawGone {
			w.droppedChains = append(w.droppedChains, r)
			w.mu.Unlock()
			return
		}
		w.mu.Unlock() // the worker went meanwhile: the chain is detached, Destroy frees it
	}
}
