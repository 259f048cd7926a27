package stream

import (
	"bytes"
	"errors"
	"hash/crc32"
	"math"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// never is how long a test watches a blocked stream to check that it stays blocked.
// It spans the spin, yield and first sleep phases of the polling policy.
const never = 20 * time.Millisecond

// soon bounds how long a test waits for something that must happen.
const soon = 5 * time.Second

func newTestBackend(t testing.TB, opts ...HostOption) Backend {
	t.Helper()
	b := NewHostBackend(opts...)
	t.Cleanup(func() { _ = b.Close() })
	return b
}

func newTestStream(t testing.TB, b Backend) Stream {
	t.Helper()
	s, err := b.NewStream()
	require.NoError(t, err)
	require.Equal(t, KindHost, s.Kind())
	return s
}

func newTestWords(t testing.TB, b Backend, n int) *WordBlock {
	t.Helper()
	wb, err := b.AllocWords(n)
	require.NoError(t, err)
	t.Cleanup(func() { _ = wb.Close() })
	return wb
}

// gate returns a host func that blocks its stream until release is called.
func gate() (fn func(), release func()) {
	ch := make(chan struct{})
	var once sync.Once
	return func() { <-ch }, func() { once.Do(func() { close(ch) }) }
}

// requireStaysBlocked checks for a while that the stream has not finished its work and
// that flag is still 0.
func requireStaysBlocked(t *testing.T, s Stream, flag *Word) {
	t.Helper()
	deadline := time.Now().Add(never)
	for time.Now().Before(deadline) {
		require.Zero(t, flag.Load(), "work behind an unsatisfied wait ran")
		done, err := s.Query()
		require.NoError(t, err)
		require.False(t, done)
		time.Sleep(time.Millisecond)
	}
}

func requireSoon(t *testing.T, cond func() bool, msg string) {
	t.Helper()
	require.Eventually(t, cond, soon, 100*time.Microsecond, msg)
}

// waitGoroutines waits until the goroutine count drops to base (executors exit
// asynchronously only where Close does not wait, but the runtime may still be
// finishing deferred work of goroutines that have signalled completion).
func waitGoroutines(t *testing.T, base int) {
	t.Helper()
	deadline := time.Now().Add(soon)
	for runtime.NumGoroutine() > base && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	require.LessOrEqual(t, runtime.NumGoroutine(), base, "goroutines leaked")
}

func TestHostBackendBasics(t *testing.T) {
	b := newTestBackend(t)
	require.Equal(t, KindHost, b.Kind())
	s := newTestStream(t, b)
	require.Zero(t, s.Handle())
	e, err := b.NewEvent()
	require.NoError(t, err)
	require.Zero(t, e.Handle())

	wb := newTestWords(t, b, 3)
	require.Equal(t, 3, wb.Len())
	for i := range 3 {
		w := wb.Word(i)
		require.Equal(t, KindHost, w.Kind())
		require.Zero(t, w.Load(), "words start zeroed")
		require.Zero(t, w.DevicePtr())
		require.Zero(t, w.HostPtr()%8)
	}
	require.Zero(t, wb.Word(0).HostPtr()%64, "blocks are cache-line aligned")
	require.Equal(t, wb.Word(0).HostPtr()+16, wb.Word(2).HostPtr())

	for _, n := range []int{0, -1, maxHostWords + 1} {
		_, err := b.AllocWords(n)
		require.ErrorIs(t, err, ErrInvalidArgument, "AllocWords(%d)", n)
	}
}

// TestHostOrdering interleaves 100k word writes and host funcs on one stream: every
// func must see exactly the write enqueued before it, and run in enqueue order.
func TestHostOrdering(t *testing.T) {
	const n = 100_000
	b := newTestBackend(t)
	s := newTestStream(t, b)
	w := newTestWords(t, b, 1).Word(0)

	type seen struct{ call, word uint64 }
	got := make([]seen, 0, n/2)
	for i := uint64(1); i <= n; i++ {
		if i%2 == 1 {
			require.NoError(t, s.WriteValue(w, i))
			continue
		}
		call := i
		require.NoError(t, s.LaunchHostFunc(func() {
			got = append(got, seen{call, w.Load()})
		}))
	}
	require.NoError(t, s.Synchronize())
	done, err := s.Query()
	require.NoError(t, err)
	require.True(t, done)

	require.Len(t, got, n/2)
	for j, g := range got {
		call := uint64(2 * (j + 1))
		require.Equal(t, seen{call, call - 1}, g, "entry %d", j)
	}
	require.Equal(t, uint64(n-1), w.Load())
	require.NoError(t, s.Close())
}

// TestHostOrderingManyProducers: work from each goroutine keeps its order when many
// goroutines enqueue on one stream at once.
func TestHostOrderingManyProducers(t *testing.T) {
	const producers, each = 8, 2000
	b := newTestBackend(t)
	s := newTestStream(t, b)

	last := make([]int, producers) // touched only by the executor
	var bad atomic.Int64
	var wg sync.WaitGroup
	for p := range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := 1; k <= each; k++ {
				assert.NoError(t, s.LaunchHostFunc(func() {
					if last[p] != k-1 {
						bad.Add(1)
					}
					last[p] = k
				}))
			}
		}()
	}
	wg.Wait()
	require.NoError(t, s.Synchronize())
	require.Zero(t, bad.Load(), "a producer's work ran out of order")
	for p := range producers {
		require.Equal(t, each, last[p])
	}
}

func TestHostWaitValueCompare(t *testing.T) {
	const top = math.MaxUint64
	cases := []struct {
		name      string
		cmp       Compare
		value     uint64
		initial   uint64   // condition false
		alsoFalse []uint64 // written while blocked: must not release the wait
		release   uint64   // condition true
	}{
		{"GEQ", GEQ, 10, 5, []uint64{9, 0}, 10},
		{"GEQ above", GEQ, 10, 5, nil, 11},
		{"GEQ across wrap", GEQ, top - 1, top - 5, []uint64{top - 2}, 1},
		{"GEQ half a range ahead counts as behind", GEQ, 10, 0, []uint64{10 + 1<<63}, 10 + 1<<62},
		{"EQ", EQ, 7, 0, []uint64{6, 8, top}, 7},
		{"AND", AND, 0b100, 0, []uint64{0b011, 0b1000}, 0b110},
		{"NOR", NOR, ^uint64(0xF0), 0xF0, []uint64{top}, 0},
		{"NOR partial", NOR, ^uint64(0xF0), 0xF0, []uint64{0xFF}, 0x70},
	}
	b := newTestBackend(t)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := newTestStream(t, b)
			defer func() { require.NoError(t, s.Close()) }()
			words := newTestWords(t, b, 2)
			w, flag := words.Word(0), words.Word(1)
			w.Store(tc.initial)
			require.False(t, tc.cmp.Holds(tc.initial, tc.value), "bad case")

			require.NoError(t, s.WaitValue(w, tc.value, tc.cmp))
			require.NoError(t, s.WriteValue(flag, 1))
			requireStaysBlocked(t, s, flag)
			for _, v := range tc.alsoFalse {
				require.False(t, tc.cmp.Holds(v, tc.value), "bad case")
				w.Store(v)
				requireStaysBlocked(t, s, flag)
			}

			require.True(t, tc.cmp.Holds(tc.release, tc.value), "bad case")
			w.Store(tc.release)
			requireSoon(t, func() bool { return flag.Load() == 1 }, "wait did not release")
			require.NoError(t, s.Synchronize())
		})
	}
}

// TestHostWaitValueAlreadyTrue: a wait whose condition holds on arrival costs nothing.
func TestHostWaitValueAlreadyTrue(t *testing.T) {
	b := newTestBackend(t)
	s := newTestStream(t, b)
	w := newTestWords(t, b, 1).Word(0)
	for range 1000 {
		require.NoError(t, s.WaitValue(w, 0, EQ))
		require.NoError(t, s.WaitValue(w, 0, GEQ))
	}
	require.NoError(t, s.Synchronize())
}

// TestHostWaitValueLongWait is released after the poller reached its sleep phase.
func TestHostWaitValueLongWait(t *testing.T) {
	b := newTestBackend(t)
	s := newTestStream(t, b)
	words := newTestWords(t, b, 2)
	w, flag := words.Word(0), words.Word(1)
	require.NoError(t, s.WaitValue(w, 1, EQ))
	require.NoError(t, s.WriteValue(flag, 1))
	time.Sleep(pollYieldFor + 20*time.Millisecond)
	require.Zero(t, flag.Load())
	w.Store(1)
	requireSoon(t, func() bool { return flag.Load() == 1 }, "sleeping wait did not release")
}

func TestHostWordArguments(t *testing.T) {
	b := newTestBackend(t)
	s := newTestStream(t, b)
	w := newTestWords(t, b, 1).Word(0)

	require.ErrorIs(t, s.WriteValue(nil, 1), ErrInvalidArgument)
	require.ErrorIs(t, s.WaitValue(nil, 1, GEQ), ErrInvalidArgument)
	require.ErrorIs(t, s.WriteValue(&Word{}, 1), ErrInvalidArgument)
	require.ErrorIs(t, s.WaitValue(&Word{}, 1, EQ), ErrInvalidArgument)
	require.ErrorIs(t, s.WaitValue(w, 1, Compare(4)), ErrInvalidArgument)
	require.ErrorIs(t, s.LaunchHostFunc(nil), ErrInvalidArgument)

	closed := newTestWords(t, b, 1)
	require.NoError(t, closed.Close())
	require.ErrorIs(t, closed.Close(), ErrClosed)
	require.ErrorIs(t, s.WriteValue(closed.Word(0), 1), ErrClosed)
	require.ErrorIs(t, s.WaitValue(closed.Word(0), 1, GEQ), ErrClosed)

	// None of the refused calls broke the stream.
	require.NoError(t, s.WriteValue(w, 3))
	require.NoError(t, s.Synchronize())
	require.Equal(t, uint64(3), w.Load())
}

// TestHostWordBlockClosedUnderStream: a block freed while queued work still names its
// words fails the stream (sticky) instead of touching freed memory.
func TestHostWordBlockClosedUnderStream(t *testing.T) {
	b := newTestBackend(t)

	t.Run("queued", func(t *testing.T) {
		s := newTestStream(t, b)
		wb, err := b.AllocWords(1)
		require.NoError(t, err)
		hold, release := gate()
		require.NoError(t, s.LaunchHostFunc(hold))
		require.NoError(t, s.WriteValue(wb.Word(0), 1))
		require.NoError(t, wb.Close())
		release()
		err = s.Synchronize()
		require.ErrorIs(t, err, ErrClosed)
		require.Contains(t, err.Error(), "WriteValue")
		require.ErrorIs(t, s.LaunchHostFunc(func() {}), ErrClosed, "sticky")
		require.ErrorIs(t, s.Close(), ErrClosed)
	})

	t.Run("while polling", func(t *testing.T) {
		s := newTestStream(t, b)
		wb, err := b.AllocWords(1)
		require.NoError(t, err)
		flag := newTestWords(t, b, 1).Word(0)
		require.NoError(t, s.WaitValue(wb.Word(0), 1, EQ))
		require.NoError(t, s.WriteValue(flag, 1))
		time.Sleep(time.Millisecond) // the executor is polling the word now
		require.NoError(t, wb.Close())
		err = s.Synchronize()
		require.ErrorIs(t, err, ErrClosed)
		require.Contains(t, err.Error(), "WaitValue")
		require.Zero(t, flag.Load(), "work behind the failed wait ran")
		_ = s.Close()
	})

	t.Run("racing", func(t *testing.T) {
		// Free blocks while a stream hammers them; must never crash.
		s := newTestStream(t, b)
		for range 200 {
			wb, err := b.AllocWords(4)
			require.NoError(t, err)
			for i := range 50 {
				if s.WriteValue(wb.Word(i%4), uint64(i)) != nil {
					break
				}
			}
			require.NoError(t, wb.Close())
			if s.Synchronize() != nil {
				_ = s.Close()
				s = newTestStream(t, b)
			}
		}
		_ = s.Close()
	})
}

func TestHostEventCrossStream(t *testing.T) {
	b := newTestBackend(t)
	a, bs := newTestStream(t, b), newTestStream(t, b)
	words := newTestWords(t, b, 2)
	aWord, bWord := words.Word(0), words.Word(1)
	e, err := b.NewEvent()
	require.NoError(t, err)

	hold, release := gate()
	require.NoError(t, a.LaunchHostFunc(hold))
	require.NoError(t, a.WriteValue(aWord, 1))
	require.NoError(t, a.Record(e))

	var aBeforeB atomic.Bool
	require.NoError(t, bs.WaitEvent(e))
	require.NoError(t, bs.LaunchHostFunc(func() { aBeforeB.Store(aWord.Load() == 1) }))
	require.NoError(t, bs.WriteValue(bWord, 1))

	requireStaysBlocked(t, bs, bWord)
	done, err := e.Query()
	require.NoError(t, err)
	require.False(t, done)

	release()
	require.NoError(t, bs.Synchronize())
	require.True(t, aBeforeB.Load(), "B ran before A's recorded work")
	require.Equal(t, uint64(1), bWord.Load())
	done, err = e.Query()
	require.NoError(t, err)
	require.True(t, done)
	require.NoError(t, e.Synchronize())
}

// TestHostEventRerecord: a wait captures the record current when WaitEvent is called.
func TestHostEventRerecord(t *testing.T) {
	b := newTestBackend(t)
	a, s1, s2 := newTestStream(t, b), newTestStream(t, b), newTestStream(t, b)
	words := newTestWords(t, b, 2)
	f1, f2 := words.Word(0), words.Word(1)
	e, err := b.NewEvent()
	require.NoError(t, err)

	hold1, release1 := gate()
	hold2, release2 := gate()
	defer release2()
	require.NoError(t, a.LaunchHostFunc(hold1))
	require.NoError(t, a.Record(e))
	require.NoError(t, s1.WaitEvent(e)) // captures the first record
	require.NoError(t, s1.WriteValue(f1, 1))

	require.NoError(t, a.LaunchHostFunc(hold2))
	require.NoError(t, a.Record(e))     // moves e past hold2
	require.NoError(t, s2.WaitEvent(e)) // captures the second record
	require.NoError(t, s2.WriteValue(f2, 1))

	requireStaysBlocked(t, s1, f1)
	release1()
	require.NoError(t, s1.Synchronize(), "s1 must not wait for the later record")
	require.Equal(t, uint64(1), f1.Load())
	requireStaysBlocked(t, s2, f2)
	done, err := e.Query()
	require.NoError(t, err)
	require.False(t, done, "e follows the latest record")

	release2()
	require.NoError(t, s2.Synchronize())
	require.Equal(t, uint64(1), f2.Load())
	require.NoError(t, e.Synchronize())
}

func TestHostEventNeverRecorded(t *testing.T) {
	b := newTestBackend(t)
	s := newTestStream(t, b)
	w := newTestWords(t, b, 1).Word(0)
	e, err := b.NewEvent()
	require.NoError(t, err)

	done, err := e.Query()
	require.NoError(t, err)
	require.True(t, done)
	require.NoError(t, e.Synchronize())
	require.NoError(t, s.WaitEvent(e))
	require.NoError(t, s.WriteValue(w, 1))
	require.NoError(t, s.Synchronize())
	require.Equal(t, uint64(1), w.Load())

	// Recorded on an idle stream: complete at once.
	require.NoError(t, s.Record(e))
	done, err = e.Query()
	require.NoError(t, err)
	require.True(t, done)
}

// TestHostEventSameStream: waiting on an event of the stream itself is implied by
// stream order and must not deadlock.
func TestHostEventSameStream(t *testing.T) {
	b := newTestBackend(t)
	s := newTestStream(t, b)
	w := newTestWords(t, b, 1).Word(0)
	e, err := b.NewEvent()
	require.NoError(t, err)
	hold, release := gate()
	require.NoError(t, s.LaunchHostFunc(hold))
	require.NoError(t, s.Record(e))
	require.NoError(t, s.WaitEvent(e))
	require.NoError(t, s.WriteValue(w, 1))
	release()
	require.NoError(t, s.Synchronize())
	require.Equal(t, uint64(1), w.Load())
}

type foreignEvent struct{}

func (foreignEvent) Query() (bool, error) { return true, nil }
func (foreignEvent) Synchronize() error   { return nil }
func (foreignEvent) Handle() uintptr      { return 1 }
func (foreignEvent) Close() error         { return nil }

func TestHostEventArguments(t *testing.T) {
	b := newTestBackend(t)
	s := newTestStream(t, b)
	require.ErrorIs(t, s.Record(foreignEvent{}), ErrWrongBackend)
	require.ErrorIs(t, s.WaitEvent(foreignEvent{}), ErrWrongBackend)
	require.ErrorIs(t, s.Record(nil), ErrInvalidArgument)
	require.ErrorIs(t, s.WaitEvent(nil), ErrInvalidArgument)
	var typedNil *hostEvent
	require.ErrorIs(t, s.Record(typedNil), ErrInvalidArgument)

	e, err := b.NewEvent()
	require.NoError(t, err)
	require.NoError(t, e.Close())
	require.ErrorIs(t, e.Close(), ErrClosed)
	require.ErrorIs(t, s.Record(e), ErrClosed)
	require.ErrorIs(t, s.WaitEvent(e), ErrClosed)
	_, err = e.Query()
	require.ErrorIs(t, err, ErrClosed)
	require.ErrorIs(t, e.Synchronize(), ErrClosed)
	require.NoError(t, s.Synchronize(), "refused calls do not break the stream")
}

func TestHostPanicIsSticky(t *testing.T) {
	b := newTestBackend(t)
	s := newTestStream(t, b)
	w := newTestWords(t, b, 1).Word(0)
	cause := errors.New("callback broke")

	var before, after atomic.Bool
	require.NoError(t, s.LaunchHostFunc(func() { before.Store(true) }))
	require.NoError(t, s.LaunchHostFunc(func() { panic(cause) }))
	_ = s.LaunchHostFunc(func() { after.Store(true) }) // may be refused if the panic ran already
	_ = s.WriteValue(w, 1)

	err := s.Synchronize()
	var pe *PanicError
	require.ErrorAs(t, err, &pe)
	require.Equal(t, cause, pe.Value)
	require.ErrorIs(t, err, cause)
	require.Contains(t, string(pe.Stack), "host_test.go", "stack points at the callback")
	require.True(t, before.Load())
	require.False(t, after.Load(), "work behind a panic ran")
	require.Zero(t, w.Load(), "work behind a panic ran")

	// Every later call reports the failure.
	require.ErrorAs(t, s.LaunchHostFunc(func() {}), &pe)
	require.ErrorAs(t, s.WriteValue(w, 2), &pe)
	require.ErrorAs(t, s.Synchronize(), &pe)
	done, err := s.Query()
	require.False(t, done)
	require.ErrorAs(t, err, &pe)
	e, err := b.NewEvent()
	require.NoError(t, err)
	require.ErrorAs(t, s.Record(e), &pe)

	require.ErrorAs(t, s.Close(), &pe, "Close reports the sticky error")
	require.ErrorIs(t, s.Close(), ErrClosed)

	// Other streams are unaffected.
	other := newTestStream(t, b)
	require.NoError(t, other.WriteValue(w, 5))
	require.NoError(t, other.Synchronize())
	require.Equal(t, uint64(5), w.Load())
}

func TestHostPanicNonError(t *testing.T) {
	b := newTestBackend(t)
	s := newTestStream(t, b)
	require.NoError(t, s.LaunchHostFunc(func() { panic("boom") }))
	err := s.Synchronize()
	var pe *PanicError
	require.ErrorAs(t, err, &pe)
	require.Equal(t, "boom", pe.Value)
	require.Contains(t, err.Error(), "boom")
	require.Nil(t, pe.Unwrap())
}

// TestHostGoexitInCallback: runtime.Goexit (t.FailNow, for one) in a callback fails the
// stream but leaves it closable, with no goroutine leaked.
func TestHostGoexitInCallback(t *testing.T) {
	base := runtime.NumGoroutine()
	b := NewHostBackend()
	s, err := b.NewStream()
	require.NoError(t, err)
	require.NoError(t, s.LaunchHostFunc(runtime.Goexit))
	err = s.Synchronize()
	require.Error(t, err)
	require.Contains(t, err.Error(), "Goexit")
	require.ErrorIs(t, err, ErrGoexit)
	var pe *PanicError
	require.ErrorAs(t, err, &pe)
	require.Error(t, s.Close())
	require.NoError(t, b.Close())
	waitGoroutines(t, base)
}

// Work a failing stream will not run has its dropped funcs run before the failure
// shows: by the time Synchronize returns the error, every one ran once (and no run
// func did). Whether the failure is a panic or a Goexit, and whether the work sat in
// the failed operation's batch or was enqueued after it.
func TestHostDroppedBeforeFailureShows(t *testing.T) {
	for _, failing := range []func(){func() { panic("boom") }, runtime.Goexit} {
		b := newTestBackend(t)
		s := newTestStream(t, b)
		gate := make(chan struct{})
		require.NoError(t, s.LaunchHostFunc(func() { <-gate })) // the rest queues behind it
		require.NoError(t, s.LaunchHostFunc(failing))
		var ran, dropped atomic.Int32
		d := s.(HostFuncDropper)
		for range 3 {
			require.NoError(t, d.LaunchHostFuncOrDrop(func() { ran.Add(1) }, func() { dropped.Add(1) }))
		}
		close(gate)
		require.Error(t, s.Synchronize())
		require.Equal(t, int32(3), dropped.Load(), "dropped funcs not run when the failure showed")
		require.Zero(t, ran.Load())
		require.Error(t, d.LaunchHostFuncOrDrop(func() {}, func() {}), "a failed stream takes no work")
		_ = s.Close()
	}
}

// TestHostDroppedGoexit: a dropped func that calls runtime.Goexit (or panics) runs
// exactly once, as does every other dropped func, and the stream still fails,
// synchronizes and closes. (A Goexit used to unwind the executor in the middle of
// fail, rerunning the batch's dropped funcs and losing the failure.)
func TestHostDroppedGoexit(t *testing.T) {
	for _, bad := range []func(){runtime.Goexit, func() { panic("dropped boom") }} {
		b := newTestBackend(t)
		s := newTestStream(t, b)
		d := s.(HostFuncDropper)
		gate := make(chan struct{})
		require.NoError(t, s.LaunchHostFunc(func() { <-gate }))
		require.NoError(t, s.LaunchHostFunc(func() { panic("p") }))
		var n [4]atomic.Int32
		for i := range n {
			if i == 1 {
				require.NoError(t, d.LaunchHostFuncOrDrop(func() {}, func() { n[i].Add(1); bad() }))
				continue
			}
			require.NoError(t, d.LaunchHostFuncOrDrop(func() {}, func() { n[i].Add(1) }))
		}
		close(gate)
		done := make(chan error, 1)
		go func() { done <- s.Synchronize() }()
		select {
		case err := <-done:
			var pe *PanicError
			require.ErrorAs(t, err, &pe)
			require.Equal(t, "p", pe.Value)
		case <-time.After(5 * time.Second):
			require.FailNow(t, "Synchronize hangs after a dropped func's Goexit")
		}
		for i := range n {
			require.Equal(t, int32(1), n[i].Load(), "dropped func %d", i)
		}
		cdone := make(chan error, 1)
		go func() { cdone <- s.Close() }()
		select {
		case err := <-cdone:
			require.Error(t, err)
		case <-time.After(5 * time.Second):
			require.FailNow(t, "Close hangs after a dropped func's Goexit")
		}
	}
}

// TestHostSelfWaitRefused: Close, Synchronize, Backend.Close and Event.Synchronize
// (on a record after the func) called from a host func of the stream they would wait
// for return an error wrapping ErrInvalidArgument instead of deadlocking; a wait on a
// record before the func is done and succeeds.
func TestHostSelfWaitRefused(t *testing.T) {
	b := newTestBackend(t)
	s := newTestStream(t, b)
	before, err := b.NewEvent()
	require.NoError(t, err)
	after, err := b.NewEvent()
	require.NoError(t, err)
	require.NoError(t, s.Record(before))
	errs := make(map[string]error)
	hold, release := gate() // after is recorded before the func waits on it
	require.NoError(t, s.LaunchHostFunc(func() {
		hold()
		errs["Synchronize"] = s.Synchronize()
		errs["Close"] = s.Close()
		errs["Backend.Close"] = b.Close()
		errs["after.Synchronize"] = after.Synchronize()
		errs["before.Synchronize"] = before.Synchronize()
	}))
	require.NoError(t, s.Record(after))
	release()
	done := make(chan error, 1)
	go func() { done <- s.Synchronize() }()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		require.FailNow(t, "a host func waiting on its own stream deadlocked")
	}
	for _, what := range []string{"Synchronize", "Close", "Backend.Close", "after.Synchronize"} {
		require.ErrorIs(t, errs[what], ErrInvalidArgument, what)
	}
	require.NoError(t, errs["before.Synchronize"])
	// Nothing was closed by the refused calls.
	require.NoError(t, s.LaunchHostFunc(func() {}))
	require.NoError(t, s.Synchronize())
	require.NoError(t, s.Close())
	require.NoError(t, b.Close())
}

// TestHostCopyWordClosedBlocks: CopyWord refuses a zero word and a word of a closed
// block at the call, as WriteValue does; a source or destination block closed after
// the enqueue fails the stream with ErrClosed and leaves dst alone (it used to write
// 0 into dst).
func TestHostCopyWordClosedBlocks(t *testing.T) {
	b := newTestBackend(t)
	s := newTestStream(t, b)
	wb := newTestWords(t, b, 2)
	closed, err := b.AllocWords(1)
	require.NoError(t, err)
	require.NoError(t, closed.Close())
	require.ErrorIs(t, s.CopyWord(closed.Word(0), wb.Word(0)), ErrClosed)
	require.ErrorIs(t, s.CopyWord(wb.Word(0), closed.Word(0)), ErrClosed)
	require.ErrorIs(t, s.CopyWord(&Word{}, wb.Word(0)), ErrInvalidArgument)
	require.ErrorIs(t, s.CopyWord(wb.Word(0), &Word{}), ErrInvalidArgument)
	require.ErrorIs(t, s.CopyWord(nil, wb.Word(0)), ErrInvalidArgument)
	wb.Word(0).Store(42)
	require.NoError(t, s.CopyWord(wb.Word(1), wb.Word(0)))
	require.NoError(t, s.Synchronize())
	require.Equal(t, uint64(42), wb.Word(1).Load())

	for _, closeSrc := range []bool{true, false} {
		s := newTestStream(t, b)
		other, err := b.AllocWords(1)
		require.NoError(t, err)
		dst, src := wb.Word(0), other.Word(0)
		if !closeSrc {
			dst, src = other.Word(0), wb.Word(0)
		}
		dst.Store(7)
		src.Store(42)
		gate := make(chan struct{})
		require.NoError(t, s.LaunchHostFunc(func() { <-gate }))
		require.NoError(t, s.CopyWord(dst, src))
		require.NoError(t, other.Close())
		close(gate)
		require.ErrorIs(t, s.Synchronize(), ErrClosed, "closeSrc=%v", closeSrc)
		if closeSrc {
			require.Equal(t, uint64(7), dst.Load(), "dst overwritten from a closed source")
		}
	}
}

func TestHostCopy(t *testing.T) {
	const words = 1 << 15 // 256 KiB of C memory: first half source, second destination
	b := newTestBackend(t)
	s := newTestStream(t, b)
	wb := newTestWords(t, b, words)
	base := wb.Word(0).HostPtr()
	// C memory, so its address as a pointer breaks no Go pointer rule (the indirection
	// keeps vet from flagging a uintptr-to-pointer conversion).
	mem := unsafe.Slice(*(**byte)(unsafe.Pointer(&base)), words*8)
	src, dst := mem[:len(mem)/2], mem[len(mem)/2:]
	srcAddr, dstAddr := base, base+uintptr(len(src))

	rng := rand.New(rand.NewPCG(1, 2))
	for i := range src {
		src[i] = byte(rng.Uint32())
	}
	want := crc32.ChecksumIEEE(src)

	// Copy in irregular pieces, out of order, then check the whole.
	pieces := [][2]int{{0, 1}, {1, 7}, {8, 4096}, {4104, 100003}, {104107, len(src) - 104107}}
	for i := len(pieces) - 1; i >= 0; i-- {
		off, n := pieces[i][0], pieces[i][1]
		require.NoError(t, s.Copy(dstAddr+uintptr(off), srcAddr+uintptr(off), n))
	}
	require.NoError(t, s.Synchronize())
	require.Equal(t, want, crc32.ChecksumIEEE(dst))
	require.True(t, bytes.Equal(src, dst))

	// Copies are ordered with the rest of the stream: a func sees the bytes.
	clear(dst)
	flag := newTestWords(t, b, 1).Word(0)
	var sum atomic.Uint32
	require.NoError(t, s.Copy(dstAddr, srcAddr, len(src)))
	require.NoError(t, s.LaunchHostFunc(func() { sum.Store(crc32.ChecksumIEEE(dst)) }))
	require.NoError(t, s.WriteValue(flag, 1))
	require.NoError(t, s.Synchronize())
	require.Equal(t, want, sum.Load())
	require.Equal(t, uint64(1), flag.Load())
}

func TestHostCopyArguments(t *testing.T) {
	b := newTestBackend(t)
	s := newTestStream(t, b)
	wb := newTestWords(t, b, 64)
	p := wb.Word(0).HostPtr()
	q := wb.Word(32).HostPtr()
	bad := []struct {
		name     string
		dst, src uintptr
		n        int
	}{
		{"negative length", q, p, -1},
		{"zero length", q, p, 0},
		{"nil dst", 0, p, 8},
		{"nil src", q, 0, 8},
		{"overlap forward", p + 8, p, 16},
		{"overlap backward", p, p + 8, 16},
		{"same range", p, p, 8},
		{"wraps", math.MaxUint64 - 4, p, 8},
	}
	for _, tc := range bad {
		require.ErrorIs(t, s.Copy(tc.dst, tc.src, tc.n), ErrInvalidArgument, tc.name)
	}
	require.NoError(t, s.Copy(q, p, 256), "adjacent ranges are fine")
	require.NoError(t, s.Synchronize())
}

// TestHostCloseDrains: Close runs everything that can run before stopping.
func TestHostCloseDrains(t *testing.T) {
	b := newTestBackend(t)
	s := newTestStream(t, b)
	w := newTestWords(t, b, 1).Word(0)
	var ran atomic.Int64
	for i := range 1000 {
		require.NoError(t, s.LaunchHostFunc(func() { ran.Add(1) }))
		require.NoError(t, s.WriteValue(w, uint64(i)))
	}
	require.NoError(t, s.Close())
	require.Equal(t, int64(1000), ran.Load())
	require.Equal(t, uint64(999), w.Load())
}

// TestHostCloseAbandonsBlockedWait: Close gives a blocked wait its grace period, then
// drops it and the work behind it.
func TestHostCloseAbandonsBlockedWait(t *testing.T) {
	const grace = 30 * time.Millisecond
	b := newTestBackend(t, WithCloseGrace(grace))
	s := newTestStream(t, b)
	words := newTestWords(t, b, 2)
	w, flag := words.Word(0), words.Word(1)
	var ran atomic.Bool
	require.NoError(t, s.WaitValue(w, 1, GEQ))
	require.NoError(t, s.WriteValue(flag, 1))
	require.NoError(t, s.LaunchHostFunc(func() { ran.Store(true) }))
	time.Sleep(time.Millisecond)

	start := time.Now()
	err := s.Close()
	took := time.Since(start)
	require.ErrorIs(t, err, ErrAbandoned)
	require.ErrorIs(t, err, ErrClosed)
	require.Contains(t, err.Error(), "2 later ops dropped")
	require.GreaterOrEqual(t, took, grace)
	require.Less(t, took, grace+time.Second)
	require.Zero(t, flag.Load())
	require.False(t, ran.Load())
	require.ErrorIs(t, s.Close(), ErrClosed)
	require.ErrorIs(t, s.Synchronize(), ErrClosed)
}

// WriteThenWait stores, then holds back later work until its wait holds; bad
// arguments enqueue nothing.
func TestHostWriteThenWait(t *testing.T) {
	b := newTestBackend(t)
	s := newTestStream(t, b)
	words, err := b.AllocWords(3)
	require.NoError(t, err)
	defer words.Close()
	trig, gate, after := words.Word(0), words.Word(1), words.Word(2)
	require.NoError(t, s.WriteThenWait(trig, 5, gate, 2, GEQ))
	require.NoError(t, s.WriteValue(after, 7))
	require.Eventually(t, func() bool { return trig.Load() == 5 }, soon, time.Millisecond)
	time.Sleep(never)
	require.Zero(t, after.Load(), "work after the wait ran before the wait held")
	gate.Store(2)
	require.Eventually(t, func() bool { return after.Load() == 7 }, soon, time.Millisecond)

	require.ErrorIs(t, s.WriteThenWait(nil, 1, gate, 1, GEQ), ErrInvalidArgument)
	require.ErrorIs(t, s.WriteThenWait(trig, 1, nil, 1, GEQ), ErrInvalidArgument)
	require.ErrorIs(t, s.WriteThenWait(trig, 1, gate, 1, Compare(9)), ErrInvalidArgument)
	require.NoError(t, s.Synchronize())
	require.Equal(t, uint64(5), trig.Load(), "a refused WriteThenWait stored nothing")
}
