package streamcore_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/stream"
	"github.com/ucpx/ucpx/stream/streamcore"
)

// A StreamSet keeps each stream once and forgets finished ones as it grows; AfterPassed
// runs its function once, after every stream passed what was queued on it, on the last
// stream's executor, or on the caller when all had passed already.
func TestStreamSetAndAfterPassed(t *testing.T) {
	b := stream.NewHostBackend()
	defer b.Close()
	var set streamcore.StreamSet
	for range 100 {
		s, err := b.NewStream()
		require.NoError(t, err)
		set.Add(s)
		set.Add(s)
		require.NoError(t, s.Close())
	}
	require.LessOrEqual(t, len(set.Streams()), 16, "finished streams are forgotten")
	n := len(set.Streams())
	require.Len(t, set.Take(), n)
	require.Empty(t, set.Streams(), "Take empties the set")

	s1, err := b.NewStream()
	require.NoError(t, err)
	defer s1.Close()
	gate := make(chan struct{})
	require.NoError(t, s1.LaunchHostFunc(func() { <-gate }))
	ran := make(chan bool, 2)
	streamcore.AfterPassed([]streamcore.Stream{s1}, func(onStream bool) { ran <- onStream })
	require.Empty(t, ran, "s1 has yet to pass its work")
	close(gate)
	require.NoError(t, s1.Synchronize())
	require.True(t, <-ran, "run by s1's executor")
	streamcore.AfterPassed(nil, func(onStream bool) { ran <- onStream })
	require.False(t, <-ran, "nothing to wait for: run by the caller")
	require.Empty(t, ran, "once")
}
