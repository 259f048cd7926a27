package prepare_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/condition"
	"github.com/ucpx/ucpx/graph"
	"github.com/ucpx/ucpx/prepare"
	"github.com/ucpx/ucpx/ucp"
)

// The staged protocol (what device buffers take: a host copy, per-partition copies on
// streams, landed words) run on host streams with host buffers.

func TestStagedPready(t *testing.T) {
	links(t, func(t *testing.T, l *link) {
		for _, tc := range []partCase{
			{"1", 64, 1, 1, inOrder, 10},
			{"8x4k", 8 << 10 * 4, 8, 8, inOrder, 20},
			{"64 reverse", 64 * 128, 64, 64, reverse, 5},
			{"1024 random", 1024 * 16, 1024, 1024, random(5), 2},
			{"256 random", 256 * 16, 256, 256, random(5), 2},
			{"1024 in order", 1024 * 16, 1024, 1024, inOrder, 2},
			{"send 8 recv 4", 8 * 512, 8, 4, inOrder, 5},
			{"send 3 recv 6", 6 * 100, 3, 6, reverse, 5},
		} {
			t.Run(tc.name, func(t *testing.T) { tc.runPready(t, l, 31, prepare.Staged) })
		}
	})
}

func TestStagedDeviceHandleTwins(t *testing.T) {
	links(t, func(t *testing.T, l *link) {
		for _, tc := range []partCase{
			{"8x4k", 8 << 10 * 4, 8, 8, inOrder, 10},
			{"64 reverse", 64 * 128, 64, 64, reverse, 3},
			{"send 64 recv 32", 64 * 1024, 64, 32, inOrder, 20},
			{"send 3 recv 6 random", 6 * 100, 3, 6, random(3), 5},
		} {
			t.Run(tc.name, func(t *testing.T) { tc.runTwins(t, l, 32, prepare.Staged) })
		}
	})
}

// What a staged request refuses: a graph node (no copy node yet), too many partitions,
// device memory on a host backend, MemH with device memory.
func TestStagedBadInput(t *testing.T) {
	l := shmLink(t)
	_, err := prepare.PsendInit(l.s, make([]byte, 2048), prepare.Staged(prepare.Params{Peer: l.toR, Partitions: 2048}))
	require.ErrorIs(t, err, ucp.ErrInvalidParam, "over 1024 staged partitions")
	_, err = prepare.PsendInit(l.s, make([]byte, 64), prepare.Params{Peer: l.toR, Partitions: 1, MemoryType: ucp.MemoryCUDA})
	require.ErrorIs(t, err, ucp.ErrInvalidParam, "device memory on host streams")
	_, err = prepare.PsendInit(l.s, make([]byte, 64), prepare.Params{Peer: l.toR, Partitions: 1, MemoryType: ucp.MemoryROCm})
	require.ErrorIs(t, err, ucp.ErrUnsupported, "ROCm memory")
	send, _, _, _ := pairWith(t, l, 256, 2, 2, 34, prepare.Staged)
	_, err = send.PreadyNode(graph.NewHost(), []condition.Node{}, 0)
	require.ErrorIs(t, err, ucp.ErrUnsupported, "graph node of a staged request")
}

// A peer that fails mid-iteration releases the staged streams: Wait reports the
// failure, the landed words hold the failed value, Free returns.
func TestStagedPeerFails(t *testing.T) {
	l := shmLink(t)
	const parts = 8
	send, recv, sbuf, _ := pairWith(t, l, parts*64, parts, parts, 35, prepare.Staged)
	require.NoError(t, recv.Start())
	require.NoError(t, send.Start())
	fill(sbuf, 1)
	require.NoError(t, send.PreadyRange(0, 3))
	boom := errors.New("peer gone")
	prepare.Fail(recv, ucp.ErrPeerFailed)
	prepare.Fail(send, boom)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.ErrorIs(t, recv.Wait(ctx), ucp.ErrPeerFailed)
	_, err := recv.Parrived(7)
	require.ErrorIs(t, err, ucp.ErrPeerFailed)
	require.ErrorIs(t, send.Wait(ctx), boom)
	require.NoError(t, recv.Free())
	require.NoError(t, send.Free())
}
