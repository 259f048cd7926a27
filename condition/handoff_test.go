package condition

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// idleTransport has nothing in flight and never progresses.
type idleTransport struct{}

func (idleTransport) Progress(Issued) bool { return false }
func (idleTransport) Completions() uint64  { return 0 }

// bareEngine is an engine whose goroutine is not started: the test plays it, parked
// on its wake channel (sharing set too when it sleeps for a driver), and reads its
// wake-ups.
func bareEngine() *Engine {
	e := &Engine{transport: idleTransport{}, active: map[*Condition]*channel{},
		wake: make(chan struct{}, 1), stop: make(chan struct{}), exited: make(chan struct{})}
	e.parked.Store(true)
	return e
}

func woke(e *Engine) bool {
	select {
	case <-e.wake:
		return true
	default:
		return false
	}
}

// A driver that stops driving wakes the engine's goroutine only if it sleeps for the
// driver, and then only for work that no kick or enqueue would announce; it always
// forgets that it drove.
func TestReleaseWakesTheEngineOnlyForUnannouncedWork(t *testing.T) {
	e := bareEngine()
	e.inflight.Store(true)
	e.Release()
	require.False(t, woke(e), "an engine not asleep for a driver (idle, or on its transport's events) is left alone")
	e.inflight.Store(false)

	e.sharing.Store(true)
	e.driven.Store(true)
	e.Release()
	require.False(t, woke(e), "nothing in flight, polled or added: the engine may sleep on")
	require.False(t, e.driven.Load(), "a released engine must not keep sleeping for a driver that left")

	e.inflight.Store(true)
	e.Release()
	require.True(t, woke(e), "operations in flight need the engine's progress")
	e.inflight.Store(false)

	e.polled.Add(1)
	e.Release()
	require.True(t, woke(e), "a trigger nobody kicks must be polled")
	e.polled.Add(-1)

	e.incoming.Store(&part{})
	e.Release()
	require.True(t, woke(e), "a part enqueued while the driver drove must reach a channel")
}

// An enqueue leaves the rounds to a goroutine that drives them, and wakes the engine once
// no driver is marked (or the engine is not sleeping for one).
func TestEnqueueWakesTheEngineUnlessADriverDrives(t *testing.T) {
	e := bareEngine()
	e.sharing.Store(true)
	e.driven.Store(true)
	require.NoError(t, e.add(&part{}))
	require.False(t, woke(e), "the driver's next round takes the part")

	e.driven.Store(false) // the driver released the rounds
	require.NoError(t, e.add(&part{}))
	require.True(t, woke(e))

	e.sharing.Store(false) // parked with nothing pending
	e.driven.Store(true)
	require.NoError(t, e.add(&part{}))
	require.True(t, woke(e))
}

// A kick runs the round on the kicking goroutine; only when another goroutine's round
// is running does it wake the engine's goroutine, which would otherwise miss the trigger
// that round may have read before the store.
func TestKickRunsTheRoundOrWakesTheEngine(t *testing.T) {
	e := bareEngine()
	e.Kick()
	require.False(t, woke(e), "the kick ran the round itself")
	require.False(t, e.driven.Load(), "a kick is not a driver: the engine must not sleep for it")

	e.drive.Lock() // another goroutine's round
	e.Kick()
	e.drive.Unlock()
	require.True(t, woke(e))
}

// A part whose host executor kicks its trigger and drives its completion (awaited)
// wakes nobody when it is enqueued, even with no driver marked and the engine parked
// with nothing pending: the executor's kick takes it.
func TestEnqueueOfAnAwaitedPartWakesNobody(t *testing.T) {
	e := bareEngine()
	require.NoError(t, e.add(&part{awaited: true}))
	require.False(t, woke(e), "the executor's kick and completion wait run the part's rounds")
	require.NoError(t, e.add(&part{}))
	require.True(t, woke(e), "a part nobody awaits needs the engine's goroutine")
}

// The engine's goroutine, asleep because only awaited parts were pending, is woken by
// a driver that stops driving with operations in flight, and by a kick or a drive whose
// round left in flight an operation no executor awaits or a trigger to poll.
func TestAwaitedOnlyEngineIsWokenWhenNeeded(t *testing.T) {
	e := bareEngine()
	e.awaitedOnly.Store(true)
	e.Kick()
	require.False(t, woke(e), "the kick ran the round and left nothing only the engine drives")
	e.Drive()
	require.False(t, woke(e))

	e.unawaited.Store(true)
	e.Kick()
	require.True(t, woke(e), "an operation in flight that no executor's wait drives")
	e.Drive()
	require.True(t, woke(e))
	e.unawaited.Store(false)

	e.polled.Add(1)
	e.Kick()
	require.True(t, woke(e), "a trigger nobody kicks must be polled")
	e.polled.Add(-1)

	e.driven.Store(true)
	e.Release()
	require.False(t, woke(e), "nothing in flight, polled or added")
	e.inflight.Store(true)
	e.driven.Store(true)
	e.Release()
	require.True(t, woke(e), "the driver stopped with operations in flight: the engine progresses them")
	require.False(t, e.awaitedOnlyPending(), "with no driver, operations in flight keep the engine up")
	e.driven.Store(true)
	require.True(t, e.awaitedOnlyPending(), "a driver drives what is in flight")
	e.unawaited.Store(true)
	require.False(t, e.awaitedOnlyPending())
}
