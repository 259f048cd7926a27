package stream

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// Polling policy of host executors. Signal words are written by other goroutines, C
// threads or a GPU with no notification, so a blocked wait has to poll. The phases
// trade wake-up latency against CPU:
//
//   - spin: poll back to back for pollSpinFor — a proxy that answers within
//     microseconds is seen within a cache-line transfer;
//   - yield: keep polling until pollYieldFor, but call runtime.Gosched every
//     pollYieldEvery so that goroutines queued on this executor's P (the proxy
//     itself, when GOMAXPROCS is small) are delayed by at most that much. Yielding on
//     every poll instead would cost a scheduler round and a wake-up of an idle
//     thread (wakep) per poll, which slows a round trip on a machine with few cores;
//   - sleep: from pollSleepMin doubling to pollSleepMax, so a stream blocked for
//     long costs next to nothing. Go's timers on Linux round sleeps below 1 ms up to
//     about 1 ms when the process is otherwise idle (the netpoller waits in whole
//     milliseconds), so a wait on a word nobody notifies (a GPU's, a peer's put)
//     sees it up to ~1 ms late. A word whose writer notifies its block (the engine,
//     storing a completion word) is waited for on the block's Changed channel
//     instead: the store wakes the executor, and the timer is only a fallback.
const (
	pollSpinFor    = 20 * time.Microsecond
	pollYieldFor   = 200 * time.Microsecond
	pollYieldEvery = 5 * time.Microsecond
	pollSleepMin   = 10 * time.Microsecond
	pollSleepMax   = 100 * time.Microsecond

	// pollClockEvery: read the clock once per this many polls while spinning; a
	// clock read costs several word reads.
	pollClockEvery = 32
)

// backoff paces one blocked wait. The zero value starts in the spin phase.
type backoff struct {
	polls     int
	start     time.Time
	single    bool          // GOMAXPROCS is 1: never spin, yield on every poll
	lastYield time.Duration // elapsed time at the last Gosched
	sleep     time.Duration // current sleep; nonzero once in the sleep phase
	timer     *time.Timer   // the sleeps on a wake channel (made on first use)
}

// sleeping reports whether the next pause sleeps: take the wake channel now, before
// looking at the word again.
func (b *backoff) sleeping() bool { return b.sleep != 0 }

// pauseOn is pause, but a sleep ends early when wake closes (nil: a plain pause).
func (b *backoff) pauseOn(wake <-chan struct{}) {
	if wake == nil || b.sleep == 0 {
		b.pause()
		return
	}
	if b.timer == nil {
		b.timer = time.NewTimer(b.sleep)
	} else {
		b.timer.Reset(b.sleep)
	}
	select {
	case <-wake:
	case <-b.timer.C:
	}
	b.timer.Stop()
	b.sleep = min(2*b.sleep, pollSleepMax)
}

// pause waits before the next poll, longer the longer the wait has lasted.
func (b *backoff) pause() {
	if b.polls == 0 {
		b.start = time.Now()
		b.single = singleP(b.start)
	}
	b.polls++
	if b.sleep == 0 {
		if b.polls%pollClockEvery != 0 {
			if b.single {
				runtime.Gosched()
			}
			return
		}
		elapsed := time.Since(b.start)
		if elapsed < pollYieldFor {
			if b.single || (elapsed >= pollSpinFor && elapsed-b.lastYield >= pollYieldEvery) {
				b.lastYield = elapsed
				runtime.Gosched()
			}
			return
		}
		// Entering the sleep phase: look once more, with the wake channel taken.
		b.sleep = pollSleepMin
		return
	}
	time.Sleep(b.sleep)
	b.sleep = min(2*b.sleep, pollSleepMax)
}

// With GOMAXPROCS=1 spinning is pure loss: no goroutine can make the progress the
// spinner waits for until it yields. Waits then yield on every poll instead. runtime.GOMAXPROCS takes the
// scheduler lock, so its value is cached and reread at most every procsRecheck (it
// can change at run time, by the program or by cgroup limits).
const procsRecheck = 10 * time.Millisecond

var procsCache struct {
	single    atomic.Bool
	checkedAt atomic.Int64 // UnixNano of the last read; 0: never
}

func singleP(now time.Time) bool {
	t := now.UnixNano()
	if last := procsCache.checkedAt.Load(); last == 0 || t-last >= int64(procsRecheck) || t < last {
		procsCache.single.Store(runtime.GOMAXPROCS(0) == 1)
		procsCache.checkedAt.Store(t)
	}
	return procsCache.single.Load()
}

// Word access guard.
//
// WaitValue and WriteValue touch C memory that the block's owner may free at any time
// (WordBlock.Close). Checking WordBlock.Closed before each access is not enough on its
// own: the block could be freed between the check and the access, and a store into
// freed C memory corrupts the C heap. So each executor brackets "check, access" with
// an odd/even counter, and the host block's free function, which runs after the block
// is marked closed, waits until no executor sits inside such a bracket it entered
// before the mark. Go atomics are sequentially consistent, so either the executor's
// check sees the mark, or the freeing side sees the bracket open and waits for it.
// The cost is two uncontended atomic adds per access.

// wordAccessors holds every running host executor, for quiesceWordAccess.
var wordAccessors struct {
	mu  sync.Mutex
	set map[*hostStream]struct{}
}

func registerWordAccessor(s *hostStream) {
	wordAccessors.mu.Lock()
	if wordAccessors.set == nil {
		wordAccessors.set = make(map[*hostStream]struct{})
	}
	wordAccessors.set[s] = struct{}{}
	wordAccessors.mu.Unlock()
}

func unregisterWordAccessor(s *hostStream) {
	wordAccessors.mu.Lock()
	delete(wordAccessors.set, s)
	wordAccessors.mu.Unlock()
}

// quiesceWordAccess returns once every executor that might have seen a word block as
// open has left its access bracket. Call it after marking the block closed and before
// freeing its memory.
func quiesceWordAccess() {
	wordAccessors.mu.Lock()
	defer wordAccessors.mu.Unlock()
	for s := range wordAccessors.set {
		g := s.wordAccess.Load()
		if g&1 == 0 {
			continue
		}
		// Wait for this bracket to close; a later one will see the mark.
		for s.wordAccess.Load() == g {
			runtime.Gosched()
		}
	}
}

// loadWord reads w for the executor, or reports false if its block was freed.
func (s *hostStream) loadWord(w *Word) (uint64, bool) {
	s.wordAccess.Add(1)
	v, ok := w.TryLoad()
	s.wordAccess.Add(1)
	return v, ok
}

// storeWord writes w for the executor, or reports false if its block was freed.
func (s *hostStream) storeWord(w *Word, v uint64) bool {
	s.wordAccess.Add(1)
	ok := w.TryStore(v)
	s.wordAccess.Add(1)
	return ok
}
