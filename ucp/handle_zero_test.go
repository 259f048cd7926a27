package ucp

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/internal/testenv"
)

// Every method of the open handles, and of the same handles closed, answers zero
// arguments (nil buffers, nil contexts, nil params) with an error or a zero value:
// no panic, no hang.
func TestHandlesTakeZeroArguments(t *testing.T) {
	for _, closed := range []bool{false, true} {
		p := newShmPair(t)
		mh, rk := mappedKey(t, p, 4096)
		sigs, err := p.b.NewSignals(hostBackend(t), 2)
		require.NoError(t, err)
		req, err := p.a.TagRecvNbx(make([]byte, 8), 1, ^uint64(0), nil)
		require.NoError(t, err)
		handles := []any{p.ctxA, p.a, p.epA, mh, rk, sigs, req}
		if closed {
			require.NoError(t, rk.Close())
			require.NoError(t, sigs.Close())
			require.NoError(t, mh.Close())
			p.close(t)
			testenv.ZeroArgs(t, nil, handles...)
			continue
		}
		// Open: the calls that end a handle are left out (the closed pass runs them).
		testenv.ZeroArgs(t, map[string]bool{"Close": true, "CloseNbx": true, "Cancel": true}, handles...)
		testenv.ExtremeArgs(t, map[string]bool{"Close": true, "CloseNbx": true, "Cancel": true}, handles...)
		require.NoError(t, rk.Close())
		require.NoError(t, sigs.Close())
		require.NoError(t, mh.Close())
	}
}

// mappedKey maps n bytes of Go memory at B and unpacks its key at A.
func mappedKey(t *testing.T, p *pair, n int) (*MemH, *Rkey) {
	t.Helper()
	mh, err := p.ctxB.MemMap(make([]byte, n))
	require.NoError(t, err)
	packed, err := mh.PackRkey()
	require.NoError(t, err)
	rk, err := p.epA.UnpackRkey(packed)
	require.NoError(t, err)
	return mh, rk
}

// The same with contexts of a (fake) device: device regions exported by CUDA IPC,
// their keys mapped at the peer.
func TestDeviceHandlesTakeBadArguments(t *testing.T) {
	wa, wb, ep, _, src := oneWayPair(t, 1<<16, true)
	mh, err := wb.Context().MemMapPtr(src.Ptr(), 1<<16, MemoryCUDA)
	require.NoError(t, err)
	key, err := mh.PackRkey()
	require.NoError(t, err)
	rk, err := ep.UnpackRkey(key)
	require.NoError(t, err)
	require.True(t, rk.Device(), "the region's key maps at the peer")
	skip := map[string]bool{"Close": true, "CloseNbx": true, "Cancel": true}
	handles := []any{wa.Context(), wa, ep, mh, rk}
	testenv.ZeroArgs(t, skip, handles...)
	testenv.ExtremeArgs(t, skip, handles...)
}
