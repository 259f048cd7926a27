package stream_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/stream"
)

// The host twin of CopyToHostAsync: the copy sits behind a gate word, so the call
// returns, and Ready says false, before the data exists; after the gate opens Bytes
// gives the source's bytes. Work enqueued after the copy (a wait never satisfied until
// the end) does not delay Wait: it synchronises on the copy's event only.
func TestCopyToHostAsyncHost(t *testing.T) {
	b := stream.NewHostBackend()
	defer b.Close()
	s, err := b.NewStream()
	require.NoError(t, err)
	defer s.Close()
	words, err := b.AllocWords(4 + 2*64) // two gates, then two 512-byte buffers in C memory
	require.NoError(t, err)
	defer words.Close()
	gate, later := words.Word(0), words.Word(1)
	const n = 512
	// The buffers are words (C memory): written and read through Store and Load.
	for i := range 64 {
		words.Word(4 + i).Store(uint64(i)*0x0101010101010101 + 0x1122334455667788)
	}
	dstWords := func() []uint64 {
		v := make([]uint64, 64)
		for i := range v {
			v[i] = words.Word(4 + 64 + i).Load()
		}
		return v
	}
	require.NoError(t, s.WaitValue(gate, 1, stream.GEQ))
	a, err := stream.CopyToHostAsync(s, words.Word(4+64).HostPtr(), words.Word(4).HostPtr(), n)
	require.NoError(t, err)
	require.NoError(t, s.WaitValue(later, 1, stream.GEQ))
	ready, err := a.Ready()
	require.NoError(t, err)
	require.False(t, ready)
	require.Equal(t, make([]uint64, 64), dstWords(), "no data before the gate opens")
	short, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	require.ErrorIs(t, a.Wait(short), context.DeadlineExceeded)
	cancel()
	gate.Store(1)
	got, err := a.Bytes()
	require.NoError(t, err)
	require.Len(t, got, n)
	for i, v := range dstWords() {
		require.Equal(t, uint64(i)*0x0101010101010101+0x1122334455667788, v, "word %d", i)
		require.Equal(t, byte(v), got[8*i], "Bytes aliases dst") // little-endian
	}
	ready, err = a.Ready()
	require.NoError(t, err)
	require.True(t, ready)
	require.NoError(t, a.Close(), "Close after completion does nothing")
	later.Store(1)
	require.NoError(t, s.Synchronize())

	// An awaitable never waited for is closed once; bad input fails at the call.
	a, err = stream.CopyToHostAsync(s, words.Word(4+64).HostPtr(), words.Word(4).HostPtr(), 8)
	require.NoError(t, err)
	require.NoError(t, a.Close())
	require.ErrorIs(t, a.Close(), stream.ErrClosed)
	_, err = a.Ready()
	require.ErrorIs(t, err, stream.ErrClosed)
	for _, c := range []struct {
		dst, src uintptr
		n        int
	}{{0, words.Word(4).HostPtr(), 8}, {words.Word(4).HostPtr(), words.Word(4).HostPtr(), 8}, {words.Word(4).HostPtr(), words.Word(8).HostPtr(), 0}} {
		_, err := stream.CopyToHostAsync(s, c.dst, c.src, c.n)
		require.ErrorIs(t, err, stream.ErrInvalidArgument, "%+v", c)
	}
	_, err = stream.CopyToHostAsync(nil, 1, 2, 8)
	require.ErrorIs(t, err, stream.ErrInvalidArgument)
	require.NoError(t, s.Synchronize())
}
