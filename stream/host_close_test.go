package stream

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestHostCloseWaitSatisfiedInGrace: a wait answered within the grace period completes
// and the work behind it runs.
func TestHostCloseWaitSatisfiedInGrace(t *testing.T) {
	b := newTestBackend(t, WithCloseGrace(soon))
	s := newTestStream(t, b)
	words := newTestWords(t, b, 2)
	w, flag := words.Word(0), words.Word(1)
	require.NoError(t, s.WaitValue(w, 1, EQ))
	require.NoError(t, s.WriteValue(flag, 1))
	go func() {
		time.Sleep(20 * time.Millisecond)
		w.Store(1)
	}()
	require.NoError(t, s.Close())
	require.Equal(t, uint64(1), flag.Load())
}

// TestHostCloseZeroGrace abandons at once.
func TestHostCloseZeroGrace(t *testing.T) {
	b := newTestBackend(t, WithCloseGrace(-time.Second))
	s := newTestStream(t, b)
	w := newTestWords(t, b, 1).Word(0)
	require.NoError(t, s.WaitValue(w, 1, EQ))
	start := time.Now()
	require.ErrorIs(t, s.Close(), ErrAbandoned)
	require.Less(t, time.Since(start), time.Second)
}

// TestHostCloseBlockedOnEvent: a stream waiting on another stream's event that never
// comes is abandoned too, and an event whose work was abandoned reports it.
func TestHostCloseBlockedOnEvent(t *testing.T) {
	b := newTestBackend(t, WithCloseGrace(10*time.Millisecond))
	a, s := newTestStream(t, b), newTestStream(t, b)
	words := newTestWords(t, b, 2)
	unwritten, flag := words.Word(0), words.Word(1)
	e, err := b.NewEvent()
	require.NoError(t, err)

	require.NoError(t, a.WaitValue(unwritten, 1, EQ))
	require.NoError(t, a.Record(e))
	require.NoError(t, s.WaitEvent(e))
	require.NoError(t, s.WriteValue(flag, 1))
	requireStaysBlocked(t, s, flag)

	// Closing the waiter abandons its wait on the event.
	require.ErrorIs(t, s.Close(), ErrAbandoned)
	require.Zero(t, flag.Load())

	// Closing the recorder abandons the recorded work: the event can never complete.
	s2 := newTestStream(t, b)
	require.NoError(t, s2.WaitEvent(e))
	require.NoError(t, s2.WriteValue(flag, 2))
	require.ErrorIs(t, a.Close(), ErrAbandoned)
	done, err := e.Query()
	require.False(t, done)
	require.ErrorIs(t, err, ErrAbandoned)
	require.ErrorIs(t, e.Synchronize(), ErrAbandoned)
	err = s2.Synchronize()
	require.ErrorIs(t, err, ErrAbandoned, "a wait on abandoned work fails")
	require.Zero(t, flag.Load())
	require.Error(t, s2.Close())
}

// TestHostEventOfFailedStream: a wait on an event recorded past a panic fails; one
// recorded before it completes.
func TestHostEventOfFailedStream(t *testing.T) {
	b := newTestBackend(t)
	a, s := newTestStream(t, b), newTestStream(t, b)
	early, late := mustEvent(t, b), mustEvent(t, b)
	hold, release := gate()
	require.NoError(t, a.LaunchHostFunc(hold))
	require.NoError(t, a.Record(early))
	require.NoError(t, a.LaunchHostFunc(func() { panic("a dies") }))
	require.NoError(t, a.Record(late))
	require.NoError(t, s.WaitEvent(early))
	require.NoError(t, s.WaitEvent(late))
	release()

	var pe *PanicError
	require.ErrorAs(t, s.Synchronize(), &pe, "the failure propagates to the waiter")
	require.NoError(t, early.Synchronize())
	require.ErrorAs(t, late.Synchronize(), &pe)
}

func mustEvent(t *testing.T, b Backend) Event {
	t.Helper()
	e, err := b.NewEvent()
	require.NoError(t, err)
	return e
}

// TestHostCallsAfterClose: everything on a closed stream returns ErrClosed.
func TestHostCallsAfterClose(t *testing.T) {
	b := newTestBackend(t)
	s := newTestStream(t, b)
	wb := newTestWords(t, b, 16)
	w := wb.Word(0)
	e := mustEvent(t, b)
	require.NoError(t, s.Close())

	require.ErrorIs(t, s.Close(), ErrClosed)
	require.ErrorIs(t, s.WriteValue(w, 1), ErrClosed)
	require.ErrorIs(t, s.WaitValue(w, 1, EQ), ErrClosed)
	require.ErrorIs(t, s.LaunchHostFunc(func() {}), ErrClosed)
	require.ErrorIs(t, s.Copy(wb.Word(8).HostPtr(), w.HostPtr(), 8), ErrClosed)
	require.ErrorIs(t, s.Record(e), ErrClosed)
	require.ErrorIs(t, s.WaitEvent(e), ErrClosed)
	require.ErrorIs(t, s.Synchronize(), ErrClosed)
	_, err := s.Query()
	require.ErrorIs(t, err, ErrClosed)
}

// TestHostConcurrentClose: many goroutines closing one stream while others enqueue;
// exactly one Close wins and nothing panics.
func TestHostConcurrentClose(t *testing.T) {
	b := newTestBackend(t)
	for range 20 {
		s := newTestStream(t, b)
		var wins atomic.Int32
		var wg sync.WaitGroup
		for range 4 {
			wg.Add(2)
			go func() {
				defer wg.Done()
				if s.Close() == nil {
					wins.Add(1)
				}
			}()
			go func() {
				defer wg.Done()
				for range 100 {
					if err := s.LaunchHostFunc(func() {}); err != nil {
						assert.ErrorIs(t, err, ErrClosed)
						return
					}
				}
			}()
		}
		wg.Wait()
		require.Equal(t, int32(1), wins.Load())
	}
}

func TestHostBackendClose(t *testing.T) {
	base := runtime.NumGoroutine()
	b := NewHostBackend(WithCloseGrace(10 * time.Millisecond))
	var streams []Stream
	for range 8 {
		s, err := b.NewStream()
		require.NoError(t, err)
		streams = append(streams, s)
	}
	wb, err := b.AllocWords(2)
	require.NoError(t, err)
	defer wb.Close()
	var ran atomic.Int64
	for _, s := range streams[:7] {
		for range 100 {
			require.NoError(t, s.LaunchHostFunc(func() { ran.Add(1) }))
		}
	}
	require.NoError(t, streams[7].WaitValue(wb.Word(0), 1, EQ)) // never satisfied
	require.NoError(t, streams[0].Close(), "a stream closed before the backend")

	err = b.Close()
	require.ErrorIs(t, err, ErrAbandoned, "the blocked stream's abandonment is reported")
	require.Equal(t, int64(700), ran.Load(), "the other streams drained")
	for _, s := range streams {
		require.ErrorIs(t, s.WriteValue(wb.Word(1), 1), ErrClosed)
		require.ErrorIs(t, s.Close(), ErrClosed)
	}
	require.ErrorIs(t, b.Close(), ErrClosed)
	_, err = b.NewStream()
	require.ErrorIs(t, err, ErrClosed)
	_, err = b.NewEvent()
	require.ErrorIs(t, err, ErrClosed)
	_, err = b.AllocWords(1)
	require.ErrorIs(t, err, ErrClosed)

	// Word blocks outlive the backend.
	wb.Word(1).Store(9)
	require.Equal(t, uint64(9), wb.Word(1).Load())
	waitGoroutines(t, base)
}

// TestHostManyStreams: 64 streams, each driven by its own goroutine with 1000 ops,
// chained by events so they also depend on each other.
func TestHostManyStreams(t *testing.T) {
	const streams, ops = 64, 1000
	base := runtime.NumGoroutine()
	b := NewHostBackend()
	wb, err := b.AllocWords(streams)
	require.NoError(t, err)
	defer wb.Close()

	var bad atomic.Int64
	var wg sync.WaitGroup
	results := make([]uint64, streams)
	for i := range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := b.NewStream()
			if !assert.NoError(t, err) {
				return
			}
			w := wb.Word(i)
			e, err := b.NewEvent()
			assert.NoError(t, err)
			var count uint64 // touched only by s's executor
			for k := uint64(1); k <= ops/4; k++ {
				assert.NoError(t, s.WriteValue(w, k))
				assert.NoError(t, s.LaunchHostFunc(func() {
					count++
					if w.Load() != k || count != k {
						bad.Add(1)
					}
				}))
				assert.NoError(t, s.Record(e))
				assert.NoError(t, s.WaitValue(w, k, GEQ))
			}
			assert.NoError(t, s.Synchronize())
			assert.NoError(t, e.Synchronize())
			results[i] = count
			assert.NoError(t, s.Close())
		}()
	}
	wg.Wait()
	require.Zero(t, bad.Load())
	for i := range streams {
		require.Equal(t, uint64(ops/4), results[i], "stream %d", i)
		require.Equal(t, uint64(ops/4), wb.Word(i).Load())
	}
	require.NoError(t, b.Close())
	waitGoroutines(t, base)
}

// TestHostEventChain: a ring of streams, each waiting on its left neighbour's event, so
// one release ripples through all of them in order.
func TestHostEventChain(t *testing.T) {
	const n = 16
	b := newTestBackend(t)
	wb := newTestWords(t, b, 1)
	step := wb.Word(0)
	hold, release := gate()
	var ss []Stream
	var prev Event
	var bad atomic.Int64
	for i := range n {
		s := newTestStream(t, b)
		ss = append(ss, s)
		if i == 0 {
			require.NoError(t, s.LaunchHostFunc(hold))
		} else {
			require.NoError(t, s.WaitEvent(prev))
		}
		require.NoError(t, s.LaunchHostFunc(func() {
			if !step.CompareAndSwap(uint64(i), uint64(i+1)) {
				bad.Add(1)
			}
		}))
		e := mustEvent(t, b)
		require.NoError(t, s.Record(e))
		prev = e
	}
	time.Sleep(time.Millisecond)
	require.Zero(t, step.Load())
	release()
	require.NoError(t, prev.Synchronize())
	require.Equal(t, uint64(n), step.Load())
	require.Zero(t, bad.Load())
	for _, s := range ss {
		require.NoError(t, s.Synchronize())
	}
}

func TestHostNoGoroutineLeak(t *testing.T) {
	base := runtime.NumGoroutine()
	for round := range 3 {
		b := NewHostBackend(WithCloseGrace(time.Millisecond))
		wb, err := b.AllocWords(4)
		require.NoError(t, err)
		var ss []Stream
		for range 16 {
			s, err := b.NewStream()
			require.NoError(t, err)
			ss = append(ss, s)
		}
		e := mustEvent(t, b)
		require.NoError(t, ss[0].LaunchHostFunc(func() { time.Sleep(time.Millisecond) }))
		require.NoError(t, ss[0].Record(e))
		for i, s := range ss {
			require.NoError(t, s.WaitEvent(e))
			require.NoError(t, s.WriteValue(wb.Word(i%4), uint64(i)))
		}
		require.NoError(t, ss[1].Synchronize())
		// Half closed one by one (one left blocked on purpose), the rest by the backend.
		require.NoError(t, ss[2].WaitValue(wb.Word(3), 1<<40, EQ), "round %d", round)
		for _, s := range ss[:8] {
			_ = s.Close()
		}
		_ = b.Close()
		require.NoError(t, wb.Close())
	}
	waitGoroutines(t, base)
}

// TestHostEnqueueFromCallback: a callback may enqueue on another stream.
func TestHostEnqueueFromCallback(t *testing.T) {
	b := newTestBackend(t)
	a, s := newTestStream(t, b), newTestStream(t, b)
	w := newTestWords(t, b, 1).Word(0)
	var errs []error
	require.NoError(t, a.LaunchHostFunc(func() {
		for i := range 10 {
			errs = append(errs, s.WriteValue(w, uint64(i+1)))
		}
	}))
	require.NoError(t, a.Synchronize())
	require.NoError(t, s.Synchronize())
	for _, err := range errs {
		require.NoError(t, err)
	}
	require.Equal(t, uint64(10), w.Load())
}

func TestHostSynchronizeManyWaiters(t *testing.T) {
	b := newTestBackend(t)
	s := newTestStream(t, b)
	hold, release := gate()
	require.NoError(t, s.LaunchHostFunc(hold))
	var wg sync.WaitGroup
	var returned atomic.Int32
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			assert.NoError(t, s.Synchronize())
			returned.Add(1)
		}()
	}
	time.Sleep(5 * time.Millisecond)
	require.Zero(t, returned.Load())
	release()
	wg.Wait()
	require.Equal(t, int32(16), returned.Load())
}
