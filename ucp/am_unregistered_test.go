package ucp

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// An active message to an id the receiver has no handler for is dropped: the
// receiver neither crashes nor delivers it, and the messages to its handler still
// arrive. (UCX 1.13 grew its handler table without initialising the new slots, so
// such a message called whatever the memory held: any peer could crash the process.)
func TestActiveMessageToUnregisteredID(t *testing.T) {
	pairs(t, func(t *testing.T, p *pair) {
		var got atomic.Int64
		var wrong atomic.Int64
		require.NoError(t, p.b.SetAmHandler(3, func(m *AmMessage) {
			if m.ID != 3 || string(m.Data()) != "ok" {
				wrong.Add(1)
			}
			got.Add(1)
		}))
		require.NoError(t, p.b.SetAmHandler(40000, func(m *AmMessage) { got.Add(1) }))
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		for _, id := range []uint{0, 1, 2, 4, 5, 17, 1000, 39999, 40001, 65000, 0xfffb, 0xffff} {
			r, err := p.epA.AmSendNbx(id, []byte("h"), []byte("stray"), nil)
			require.NoError(t, err, "id %d", id)
			require.NoError(t, r.Wait(ctx))
			r, err = p.epA.AmSendNbx(3, nil, []byte("ok"), nil)
			require.NoError(t, err)
			require.NoError(t, r.Wait(ctx))
		}
		require.Eventually(t, func() bool { p.b.Progress(); return got.Load() == 12 }, 10*time.Second, time.Millisecond)
		for range 1000 {
			p.b.Progress()
		}
		require.EqualValues(t, 12, got.Load(), "only the messages to the handler's id arrive")
		require.Zero(t, wrong.Load())
	})
}
