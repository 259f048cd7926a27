package stream

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Host funcs of two streams waiting for each other: before, they deadlocked (the
// own-stream case was refused, a cycle through another stream was not). Now the wait
// that would close the cycle is refused with an error wrapping ErrInvalidArgument and
// both streams go on. Which of two host funcs closes the cycle depends on timing, so
// these tests ask that exactly one of them was refused.

// settleWithin fails the test unless every stream synchronizes within d (a hang
// detector: the deadlocks these tests catch never end).
func settleWithin(t *testing.T, d time.Duration, streams ...Stream) {
	t.Helper()
	done := make(chan error, len(streams))
	for _, s := range streams {
		go func() { done <- s.Synchronize() }()
	}
	deadline := time.After(d)
	for range streams {
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-deadline:
			require.FailNow(t, "host funcs waiting for each other's streams deadlocked")
		}
	}
}

// requireOneRefused checks that exactly one of the two waits was refused as a
// deadlock (ErrInvalidArgument) and that the other succeeded.
func requireOneRefused(t *testing.T, errA, errB error) {
	t.Helper()
	switch {
	case errors.Is(errA, ErrInvalidArgument):
		require.NoError(t, errB, "the other wait")
	case errors.Is(errB, ErrInvalidArgument):
		require.NoError(t, errA, "the other wait")
	default:
		require.FailNow(t, "no wait refused", "A: %v, B: %v", errA, errB)
	}
}

// TestHostCrossStreamSynchronizeCycle: a host func on A synchronizes B while B's
// queue holds a host func that synchronizes A.
func TestHostCrossStreamSynchronizeCycle(t *testing.T) {
	b := newTestBackend(t)
	sa, sb := newTestStream(t, b), newTestStream(t, b)
	holdA, startA := gate()
	holdB, startB := gate()
	var errA, errB error
	require.NoError(t, sb.LaunchHostFunc(func() { holdB(); errB = sa.Synchronize() }))
	require.NoError(t, sa.LaunchHostFunc(func() { holdA(); errA = sb.Synchronize() }))
	startA()
	startB()
	settleWithin(t, soon, sa, sb)
	requireOneRefused(t, errA, errB)
	// Both streams are healthy: the refusal is the call's error, not the stream's.
	require.NoError(t, sa.LaunchHostFunc(func() {}))
	require.NoError(t, sb.LaunchHostFunc(func() {}))
	settleWithin(t, soon, sa, sb)
}

// TestHostCrossStreamEventCycle: B's host func waits (Event.Synchronize) on an event
// recorded on A behind A's host func, which synchronizes B.
func TestHostCrossStreamEventCycle(t *testing.T) {
	b := newTestBackend(t)
	sa, sb := newTestStream(t, b), newTestStream(t, b)
	ev, err := b.NewEvent()
	require.NoError(t, err)
	holdA, startA := gate()
	holdB, startB := gate()
	var errA, errB error
	require.NoError(t, sa.LaunchHostFunc(func() { holdA(); errA = sb.Synchronize() }))
	require.NoError(t, sa.Record(ev))
	require.NoError(t, sb.LaunchHostFunc(func() { holdB(); errB = ev.Synchronize() }))
	startA()
	startB()
	settleWithin(t, soon, sa, sb)
	requireOneRefused(t, errA, errB)
}

// TestHostCrossStreamWaitEventCycle: A's host func synchronizes B while B's queue
// holds a WaitEvent on an event recorded on A behind that func. The stream's own
// wait cannot be refused: A's Synchronize is, whichever of the two blocked first.
func TestHostCrossStreamWaitEventCycle(t *testing.T) {
	b := newTestBackend(t)
	sa, sb := newTestStream(t, b), newTestStream(t, b)
	ev, err := b.NewEvent()
	require.NoError(t, err)
	holdA, startA := gate()
	errA := make(chan error, 1)
	require.NoError(t, sa.LaunchHostFunc(func() { holdA(); errA <- sb.Synchronize() }))
	require.NoError(t, sa.Record(ev))
	require.NoError(t, sb.WaitEvent(ev))
	startA()
	settleWithin(t, soon, sa, sb)
	require.ErrorIs(t, <-errA, ErrInvalidArgument)
}

// TestHostCrossStreamCloseCycle: A's host func closes B while B's queue holds a host
// func that synchronizes A. A refused Close closes nothing.
func TestHostCrossStreamCloseCycle(t *testing.T) {
	b := newTestBackend(t)
	sa, sb := newTestStream(t, b), newTestStream(t, b)
	holdA, startA := gate()
	holdB, startB := gate()
	var errA error
	errB := make(chan error, 1)
	require.NoError(t, sb.LaunchHostFunc(func() { holdB(); errB <- sa.Synchronize() }))
	require.NoError(t, sa.LaunchHostFunc(func() { holdA(); errA = sb.Close() }))
	startA()
	startB()
	settleWithin(t, soon, sa) // B may be closed: its func reports on errB
	select {
	case err := <-errB:
		requireOneRefused(t, errA, err)
	case <-time.After(soon):
		require.FailNow(t, "B's host func never returned")
	}
	if errA != nil {
		require.NoError(t, sb.Close(), "B was closed by the refused Close")
	} else {
		require.ErrorIs(t, sb.Close(), ErrClosed)
	}
}

// TestHostCrossStreamWaitAllowed: a host func may wait for another stream that does
// not wait for it, and for an event of its own stream recorded before it.
func TestHostCrossStreamWaitAllowed(t *testing.T) {
	b := newTestBackend(t)
	sa, sb := newTestStream(t, b), newTestStream(t, b)
	hold, release := gate()
	ran := make(chan struct{})
	require.NoError(t, sb.LaunchHostFunc(func() { hold(); close(ran) }))
	ev, err := b.NewEvent()
	require.NoError(t, err)
	require.NoError(t, sb.Record(ev))
	var errSync, errEvent error
	require.NoError(t, sa.LaunchHostFunc(func() {
		release()
		errSync = sb.Synchronize()
		errEvent = ev.Synchronize()
	}))
	settleWithin(t, soon, sa, sb)
	<-ran
	require.NoError(t, errSync)
	require.NoError(t, errEvent)
}

// TestHostCrossStreamWaitEventClosesCycle: as above, with A's Synchronize blocked
// first and B's WaitEvent closing the cycle after: A's Synchronize is woken and
// refused.
func TestHostCrossStreamWaitEventClosesCycle(t *testing.T) {
	b := newTestBackend(t)
	sa, sb := newTestStream(t, b), newTestStream(t, b)
	ev, err := b.NewEvent()
	require.NoError(t, err)
	holdA, startA := gate()
	holdB, startB := gate()
	errA := make(chan error, 1)
	require.NoError(t, sb.LaunchHostFunc(holdB))
	require.NoError(t, sa.LaunchHostFunc(func() { holdA(); errA <- sb.Synchronize() }))
	require.NoError(t, sa.Record(ev))
	require.NoError(t, sb.WaitEvent(ev))
	startA()
	ha := sa.(*hostStream)
	require.Eventually(t, func() bool {
		hostWaits.mu.Lock()
		defer hostWaits.mu.Unlock()
		return hostWaits.blocked[ha] != nil
	}, soon, time.Millisecond, "A's host func never blocked in Synchronize")
	startB()
	settleWithin(t, soon, sa, sb)
	require.ErrorIs(t, <-errA, ErrInvalidArgument)
}
