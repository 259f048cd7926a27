package condition

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/internal/testenv"
	"github.com/ucpx/ucpx/protocol"

	"github.com/ucpx/ucpx/stream"
)

func backend(t *testing.T) stream.Backend {
	b := stream.NewHostBackend()
	t.Cleanup(func() { _ = b.Close() })
	return b
}

func TestCreateValidates(t *testing.T) {
	b := backend(t)
	s, err := b.NewStream()
	require.NoError(t, err)
	defer s.Close()
	for _, p := range []Param{
		{},
		{Category: Stream, Backend: b},
		{Category: Stream, Stream: s},
		{Category: KernelTriggered},
		{Category: Category(99), Backend: b},
	} {
		_, err := Create(p)
		require.ErrorIs(t, err, ErrInvalidParam, "%+v", p)
	}
	_, err = Create(Param{Category: Graph, Backend: b})
	require.ErrorIs(t, err, ErrInvalidParam) // no graph
}

func TestStreamArmAndRetire(t *testing.T) {
	b := backend(t)
	s, err := b.NewStream()
	require.NoError(t, err)
	defer s.Close()
	c, err := Create(Param{Category: Stream, Backend: b, Stream: s})
	require.NoError(t, err)

	var recorded []uint64
	for i := 0; i < 3; i++ {
		seq, err := c.arm(true, streamWork{}, func(seq uint64) { recorded = append(recorded, seq) })
		require.NoError(t, err)
		require.Equal(t, uint64(i+1), seq)
	}
	require.Equal(t, []uint64{1, 2, 3}, recorded)
	var ran atomic.Bool
	require.NoError(t, s.LaunchHostFunc(func() { ran.Store(true) }))

	// The stream stores the first trigger, then waits for completion 1.
	require.Eventually(t, func() bool { return c.trigger.Load() == 1 }, 5*time.Second, time.Millisecond)
	c.retire(1, nil)
	require.Eventually(t, func() bool { return c.trigger.Load() == 2 }, 5*time.Second, time.Millisecond)
	require.Equal(t, 2, c.Pending())
	require.ErrorIs(t, c.Destroy(), ErrBusy)
	c.retire(2, errTest)
	c.retire(3, nil)
	require.NoError(t, s.Synchronize())
	require.True(t, ran.Load())
	require.ErrorIs(t, c.Err(), errTest)
	require.Equal(t, uint64(3), c.done.Load())
	require.NoError(t, c.Destroy())
	require.ErrorIs(t, c.Destroy(), ErrDestroyed)
	_, err = c.arm(true, streamWork{}, func(uint64) {})
	require.ErrorIs(t, err, ErrDestroyed)
}

var errTest = &testError{}

type testError struct{}

func (*testError) Error() string { return "test error" }

func TestKernelTriggeredHandle(t *testing.T) {
	b := backend(t)
	c, err := Create(Param{Category: KernelTriggered, Backend: b})
	require.NoError(t, err)
	_, err = c.arm(false, streamWork{}, func(uint64) {})
	require.NoError(t, err)
	h, err := c.DeviceHandle()
	require.NoError(t, err)
	require.Equal(t, uint64(1), h.Value)
	require.Equal(t, c.trigger.HostPtr(), h.Trigger)
	require.False(t, Test(h))
	require.NoError(t, Trigger(h))
	require.Equal(t, uint64(1), c.trigger.Load())
	c.retire(1, nil)
	require.True(t, Test(h))
	require.ErrorIs(t, Trigger(DeviceHandle{}), ErrInvalidParam)
	require.NoError(t, c.Destroy())
	_, err = c.DeviceHandle()
	require.ErrorIs(t, err, ErrDestroyed)
}

func TestStreamConditionHasNoDeviceHandle(t *testing.T) {
	b := backend(t)
	s, err := b.NewStream()
	require.NoError(t, err)
	defer s.Close()
	c, err := Create(Param{Category: Stream, Backend: b, Stream: s})
	require.NoError(t, err)
	defer c.Destroy()
	_, err = c.DeviceHandle()
	require.ErrorIs(t, err, ErrInvalidParam)
	require.ErrorIs(t, c.waitOnStream(nil, 1), ErrInvalidParam)
}

func TestArmOnClosedStreamArmsNothing(t *testing.T) {
	b := backend(t)
	s, err := b.NewStream()
	require.NoError(t, err)
	c, err := Create(Param{Category: Stream, Backend: b, Stream: s})
	require.NoError(t, err)
	require.NoError(t, s.Close())
	called := false
	_, err = c.arm(true, streamWork{}, func(uint64) { called = true })
	require.ErrorIs(t, err, stream.ErrClosed)
	require.False(t, called)
	require.Equal(t, 0, c.Pending())
	require.NoError(t, c.Destroy())
}

// A handle outlives its condition: after Destroy, Trigger refuses (its words are freed,
// a store would write freed memory) and Test reports the operations done.
func TestHandleAfterDestroy(t *testing.T) {
	b := stream.NewHostBackend()
	defer b.Close()
	c, err := Create(Param{Category: KernelTriggered, Backend: b})
	require.NoError(t, err)
	h, err := c.DeviceHandle()
	require.NoError(t, err)
	require.NoError(t, Trigger(h))
	require.True(t, Test(h))
	require.NoError(t, c.Destroy())
	require.ErrorIs(t, Trigger(h), ErrDestroyed)
	require.True(t, Test(h))
}

// A group left open (and empty) by a Destroy ends with ErrDestroyed, like every other
// call on the destroyed condition.
func TestEndGroupAfterDestroy(t *testing.T) {
	_, c := streamCondition(t)
	require.NoError(t, c.BeginGroup())
	require.NoError(t, c.Destroy())
	require.ErrorIs(t, c.EndGroup(), ErrDestroyed)
	require.ErrorIs(t, c.EndGroup(), ErrInvalidParam, "no group is open any more")
}

// The Condition of a failed Create is nil: its methods report that instead of crashing.
func TestNilCondition(t *testing.T) {
	var c *Condition
	require.Nil(t, c.Node())
	require.Nil(t, c.WaitNode())
	require.False(t, c.Destroyed())
	require.Nil(t, c.Backend())
	require.Nil(t, c.Stream())
	require.Zero(t, c.Pending())
	require.ErrorIs(t, c.Err(), ErrInvalidParam)
	require.ErrorIs(t, c.ClearErr(), ErrInvalidParam)
	_, err := c.StatusAt(1)
	require.ErrorIs(t, err, ErrInvalidParam)
	_, err = c.DeviceHandle()
	require.ErrorIs(t, err, ErrInvalidParam)
	require.ErrorIs(t, c.BeginGroup(), ErrInvalidParam)
	require.ErrorIs(t, c.EndGroup(), ErrInvalidParam)
	require.ErrorIs(t, c.RecordEvent(nil), ErrInvalidParam)
	require.ErrorIs(t, c.Destroy(), ErrInvalidParam)
	testenv.NilMethods(t, (*Condition)(nil), (*Chain)(nil))
}

// A nil Chain answers ErrInvalidParam (or zero values) too.
func TestNilChain(t *testing.T) {
	var c *Chain
	require.ErrorIs(t, c.Then(), ErrInvalidParam)
	require.Zero(t, c.Steps())
	require.ErrorIs(t, c.Start(), ErrInvalidParam)
	require.ErrorIs(t, c.Wait(context.Background()), ErrInvalidParam)
	_, err := c.Test()
	require.ErrorIs(t, err, ErrInvalidParam)
	require.Zero(t, c.Iterations())
	require.NoError(t, c.Err())
	require.Nil(t, c.IterationTimes())
	require.ErrorIs(t, c.Destroy(), ErrInvalidParam)
}

// StatusAt tells each of the latest maxFailedKept operations' outcomes apart, however
// many failed before them (a dead peer fails every queued operation at once).
func TestStatusAtAfterManyFailures(t *testing.T) {
	c, err := Create(Param{Category: KernelTriggered, Backend: backend(t)})
	require.NoError(t, err)
	const n = 3*maxFailedKept + 17
	errs := make([]error, n+1)
	for i := 1; i <= n; i++ {
		seq, err := c.arm(false, streamWork{}, func(uint64) {})
		require.NoError(t, err)
		require.Equal(t, uint64(i), seq)
	}
	for seq := uint64(1); seq <= n; seq++ {
		if seq%3 != 0 { // two of three fail, each with its own error
			errs[seq] = fmt.Errorf("operation %d: %w", seq, errTest)
		}
		c.retire(seq, errs[seq])
	}
	for seq := uint64(n - maxFailedKept + 1); seq <= n; seq++ {
		done, err := c.StatusAt(seq)
		require.True(t, done)
		require.Equal(t, errs[seq], err, "operation %d", seq)
	}
	done, err := c.StatusAt(n + 1)
	require.False(t, done)
	require.NoError(t, err)
	require.ErrorIs(t, c.Err(), errTest)
	require.Contains(t, c.Err().Error(), "operation 1:")
	require.NoError(t, c.Destroy())
}

// BenchmarkRetireFailed is the cost of retiring one failed operation once the
// condition remembers maxFailedKept failures.
func BenchmarkRetireFailed(b *testing.B) {
	bk := stream.NewHostBackend()
	defer bk.Close()
	c, err := Create(Param{Category: KernelTriggered, Backend: bk})
	if err != nil {
		b.Fatal(err)
	}
	for i := 0; i < maxFailedKept+b.N; i++ {
		if _, err := c.arm(false, streamWork{}, func(uint64) {}); err != nil {
			b.Fatal(err)
		}
	}
	seq := uint64(0)
	for ; seq < maxFailedKept; seq++ {
		c.retire(seq+1, errTest)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		seq++
		c.retire(seq, errTest)
	}
}

// Live conditions of each category and a chain, and the same destroyed, answer zero
// arguments and extreme integers (StatusAt of sequence numbers never issued, a chain
// of 2^64-1 repetitions) with errors or zero values: no panic, no hang.
func TestHandlesTakeZeroArguments(t *testing.T) {
	for _, destroyed := range []bool{false, true} {
		b := stream.NewHostBackend()
		s, err := b.NewStream()
		require.NoError(t, err)
		var handles []any
		for _, cat := range []Category{Stream, KernelTriggered} {
			c, err := Create(Param{Category: cat, Backend: b, Stream: s})
			require.NoError(t, err)
			handles = append(handles, c)
		}
		for _, repeat := range []uint64{0, ^uint64(0)} {
			ch, err := NewChain(ChainParam{Repeat: repeat})
			require.NoError(t, err)
			handles = append(handles, ch)
		}
		skip := map[string]bool{"Destroy": true}
		if destroyed {
			for _, h := range handles {
				switch h := h.(type) {
				case *Condition:
					require.NoError(t, h.Destroy())
				case *Chain:
					require.NoError(t, h.Destroy())
				}
			}
			skip = nil
		}
		testenv.ZeroArgs(t, skip, handles...)
		testenv.ExtremeArgs(t, skip, handles...)
		_, err = NewEngine(nil, protocol.Config{}, false)
		require.ErrorIs(t, err, ErrInvalidParam, "an engine needs a transport")
		for _, h := range handles {
			if c, ok := h.(*Condition); ok {
				_ = c.Destroy()
			}
			if c, ok := h.(*Chain); ok {
				_ = c.Destroy()
			}
		}
		require.NoError(t, s.Close())
		require.NoError(t, b.Close())
	}
}

// A stream given a wait on a destroyed condition's words that then drops its work (its
// Close abandons a wait before it) releases the words all the same: they are freed
// once no stream will read them, not never.
func TestDestroyedWordsFreedWhenAWaitingStreamDrops(t *testing.T) {
	b := stream.NewHostBackend(stream.WithCloseGrace(10 * time.Millisecond))
	defer b.Close()
	s2, err := b.NewStream()
	require.NoError(t, err)
	gate, err := b.AllocWords(1)
	require.NoError(t, err)
	defer gate.Close()
	require.NoError(t, s2.WaitValue(gate.Word(0), 1, stream.GEQ)) // nobody answers
	c, err := Create(Param{Category: KernelTriggered, Backend: b})
	require.NoError(t, err)
	require.NoError(t, c.waitOnStream(s2, 0))
	require.NoError(t, c.Destroy())
	require.False(t, c.words.Closed(), "s2 has yet to pass its wait")
	require.ErrorIs(t, s2.Close(), stream.ErrAbandoned)
	require.Eventually(t, c.words.Closed, 5*time.Second, time.Millisecond)
}

// Streams made and closed one after another, each given a wait on a condition, do
// not pile up in it: closed ones are forgotten as new ones come.
func TestForeignStreamsPruned(t *testing.T) {
	b := backend(t)
	c, err := Create(Param{Category: KernelTriggered, Backend: b})
	require.NoError(t, err)
	for range 100 {
		s, err := b.NewStream()
		require.NoError(t, err)
		require.NoError(t, c.waitOnStream(s, 0))
		require.NoError(t, s.Close())
	}
	require.LessOrEqual(t, len(c.foreign.Streams()), 16, "streamcore.StreamSet prunes past 16")
	require.NoError(t, c.Destroy())
	require.Eventually(t, c.words.Closed, 5*time.Second, time.Millisecond)
}
