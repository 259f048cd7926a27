package condition

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/stream/streamcore"
	"github.com/ucpx/ucpx/trace"
)

// stampingStream is a host stream whose polls stamp as a CUDA stream's do: when the
// stream reaches the poll it stores 1000·v into stamps[0], once the poll is over
// 1000·v+500 into stamps[1].
type stampingStream struct{ streamcore.Stream }

func (s stampingStream) PollValueStamped(w *streamcore.Word, v uint64, stamps *streamcore.Word) error {
	b := stamps.Block()
	var second *streamcore.Word
	for i := 0; i+1 < b.Len(); i++ {
		if b.Word(i) == stamps {
			second = b.Word(i + 1)
		}
	}
	if err := s.LaunchHostFunc(func() { stamps.Store(1000 * v) }); err != nil {
		return err
	}
	if err := s.PollValue(w, v); err != nil {
		return err
	}
	return s.LaunchHostFunc(func() { second.Store(1000*v + 500) })
}

// Traced polls on a stamping stream put one device span per operation on the
// condition's device track; more polls in flight than the ring holds go unstamped
// instead of waiting for a slot, and every operation still completes.
func TestTracedPollsAreStamped(t *testing.T) {
	b := backend(t)
	hs, err := b.NewStream()
	require.NoError(t, err)
	defer hs.Close()
	s := stampingStream{hs}
	c, err := Create(Param{Category: Stream, Backend: b, Stream: s})
	require.NoError(t, err)
	rec := trace.NewRecorder()

	const n = deviceStampSlots + 6 // armed before the stream passes any poll
	for i := 1; i <= n; i++ {
		seq, err := c.arm(true, streamWork{poll: true, trace: rec}, func(uint64) {})
		require.NoError(t, err)
		require.Equal(t, uint64(i), seq)
	}
	for i := 1; i <= n; i++ {
		c.retire(uint64(i), nil)
	}
	require.NoError(t, s.Synchronize())
	require.Equal(t, uint64(n), c.done.Load())
	require.NoError(t, c.Destroy())
	require.NoError(t, s.Synchronize()) // the destroy's host function harvested the ring

	waits := map[uint64]float64{}
	for _, ev := range rec.Events() {
		if ev.Name == trace.PhaseDeviceWait {
			require.Equal(t, c.id+trace.DeviceTrack, ev.Tid)
			waits[ev.Args["seq"].(uint64)] = ev.Dur
		}
	}
	require.Len(t, waits, deviceStampSlots, "one span per stamped poll; the rest went unstamped")
	for seq, d := range waits {
		require.LessOrEqual(t, seq, uint64(deviceStampSlots), "slots go to the first polls armed")
		require.InDelta(t, 0.5, d, 1e-9, "seq %d", seq)
	}
}

// A condition traced into a new recorder while its stamped polls wait on the stream
// keeps its ring (the stream stamps into it later): every poll's span reaches one of
// the two recorders, none is lost.
func TestStampsFollowANewRecorder(t *testing.T) {
	b := backend(t)
	hs, err := b.NewStream()
	require.NoError(t, err)
	defer hs.Close()
	gate, err := b.AllocWords(1)
	require.NoError(t, err)
	defer gate.Close()
	require.NoError(t, hs.WaitValue(gate.Word(0), 1, streamcore.GEQ))
	s := stampingStream{hs}
	c, err := Create(Param{Category: Stream, Backend: b, Stream: s})
	require.NoError(t, err)
	first, second := trace.NewRecorder(), trace.NewRecorder()
	const n = 5
	for i := 1; i <= n; i++ {
		rec := first
		if i > 3 {
			rec = second // the engine traces into another recorder from here
		}
		_, err := c.arm(true, streamWork{poll: true, trace: rec}, func(uint64) {})
		require.NoError(t, err)
	}
	gate.Word(0).Store(1)
	for i := 1; i <= n; i++ {
		c.retire(uint64(i), nil)
	}
	require.NoError(t, s.Synchronize())
	require.NoError(t, c.Destroy())
	require.NoError(t, s.Synchronize())

	seen := map[uint64]bool{}
	for _, rec := range []*trace.Recorder{first, second} {
		for _, ev := range rec.Events() {
			if ev.Name == trace.PhaseDeviceWait {
				seq := ev.Args["seq"].(uint64)
				require.False(t, seen[seq], "seq %d in both recorders", seq)
				seen[seq] = true
			}
		}
	}
	require.Len(t, seen, n, "a span per poll")
}
