package ucp

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ucpx/ucpx/internal/goid"
)

// progressThread is the goroutine of WorkerParams.ProgressThread: it progresses the
// worker while anything happens and parks on the worker's event fd (ucp_worker_arm)
// when nothing does, so a process that is only a target of RMA, atomics or active
// messages, or whose streams wait on words a peer writes, completes with no loop of
// its own and costs no CPU while idle.
type progressThread struct {
	stop     chan struct{}
	stopOnce sync.Once
	exited   chan struct{}
	parks    atomic.Int64 // times it parked on the event fd
	// id is the thread's goroutine (goid): callbacks run on it, and one that closes
	// the worker must not wait for its exit.
	id atomic.Uint64
}

func (w *Worker) startProgressThread() {
	t := &progressThread{stop: make(chan struct{}), exited: make(chan struct{})}
	w.progress = t
	go w.runProgressThread(t)
}

func (w *Worker) runProgressThread(t *progressThread) {
	defer close(t.exited)
	t.id.Store(goid.Current())
	ctx := doneCtx{t.stop} // a park on the event fd ends at stop
	idle := 0
	var idleSince time.Duration
	// UCX's own progress counts as activity too: a target's worker applies a peer's
	// emulated puts and atomics (shared memory to memory UCX did not allocate, tcp)
	// with nothing of ours completing, and parking between them would put a wake-up
	// behind every one.
	seen := w.raw.Progressed()
	for {
		n := w.Progress()
		// Looked at after Progress: a callback it ran may have closed the worker, and
		// the UCX worker is gone then.
		select {
		case <-t.stop:
			return
		default:
		}
		if now := w.raw.Progressed(); n > 0 || now != seen {
			seen, idle = now, 0
			continue
		}
		idle++
		if idle == 1 {
			idleSince = monotonic()
		}
		// Poll without yielding for the worker's spin time after the last thing that
		// progressed (as a wait spins before it parks): a yield between polls puts the
		// next arrival behind whatever else the scheduler runs, a park behind a wake-up.
		// The clock is read every 64 rounds; a yield every 4096 keeps a busy machine fair.
		if idle&63 != 0 {
			continue
		}
		if monotonic()-idleSince < w.spinTime {
			if idle&4095 == 0 {
				runtime.Gosched()
			}
			continue
		}
		if w.efd < 0 {
			// No event fd to park on (WaitForEvents would return at once): back
			// off instead of polling a core at 100 %.
			select {
			case <-t.stop:
				return
			case <-time.After(50 * time.Microsecond):
			}
		} else {
			// Park until the event fd fires (a message, a remote operation) or stop.
			t.parks.Add(1)
			_ = w.WaitForEvents(ctx, 1<<62)
		}
		idle = 0
	}
}

// stopProgressThread ends the goroutine and waits for it, unless called on it (a
// callback closes the worker): it is in no UCX call then, and returns once the
// callback did. Caller does not hold w.mu.
func (w *Worker) stopProgressThread() {
	t := w.progress
	if t == nil {
		return
	}
	t.stopOnce.Do(func() { close(t.stop) })
	if !goid.Is(t.id.Load()) {
		<-t.exited
	}
}
