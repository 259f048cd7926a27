package ucp

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestSmokeTag(t *testing.T) {
	p := newPair(t, nil)
	for _, n := range []int{0, 8, 100000, 4 << 20} {
		src := pattern(n, int64(n))
		dst := make([]byte, n)
		rr, err := p.b.TagRecvNbx(dst, 7, ^uint64(0), nil)
		require.NoError(t, err)
		sr, err := p.epA.TagSendNbx(src, 7, nil)
		require.NoError(t, err)
		waitAll(t, 10*time.Second, rr, sr)
		require.NoError(t, rr.Err())
		require.NoError(t, sr.Err())
		require.Equal(t, n, rr.Length())
		require.Equal(t, checksum(src), checksum(dst))
	}
}
