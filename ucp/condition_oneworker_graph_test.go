package ucp_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/condition"
	"github.com/ucpx/ucpx/graph"
	"github.com/ucpx/ucpx/stream"
	"github.com/ucpx/ucpx/ucp"
)

// A host graph's Graph condition carries the operations of one worker: a receive of a
// second worker is refused (ErrInvalidParam). Before, both engines carried it, the
// first to see a launch's trigger took it, and the launch completed once that
// engine's receive did, with the other worker's receive still empty.
func TestGraphConditionRefusesSecondWorker(t *testing.T) {
	uctx, err := ucp.NewContext(ucp.ContextParams{})
	require.NoError(t, err)
	defer uctx.Close()
	wa, err := uctx.NewWorker(ucp.WorkerParams{})
	require.NoError(t, err)
	wb, err := uctx.NewWorker(ucp.WorkerParams{})
	require.NoError(t, err)
	wc, err := uctx.NewWorker(ucp.WorkerParams{})
	require.NoError(t, err)
	aAddr, err := wa.Address()
	require.NoError(t, err)
	toA, err := wc.ConnectAddress(aAddr, &ucp.EndpointParams{NoPeerErrorHandling: true})
	require.NoError(t, err)

	backend := stream.NewHostBackend()
	defer backend.Close()
	g := graph.NewHost()
	gc, err := condition.Create(condition.Param{Category: condition.Graph, Backend: backend, Graph: g})
	require.NoError(t, err)
	bufA := make([]byte, 8)
	ra, err := wa.TagRecvNbx(bufA, 1, ^uint64(0), &ucp.RequestParam{Condition: gc})
	require.NoError(t, err)
	_, err = wb.TagRecvNbx(make([]byte, 8), 2, ^uint64(0), &ucp.RequestParam{Condition: gc})
	require.ErrorIs(t, err, ucp.ErrInvalidParam, "a receive of a second worker on the graph condition")

	x, err := g.Instantiate()
	require.NoError(t, err)
	defer x.Close()
	s, err := backend.NewStream()
	require.NoError(t, err)
	defer s.Close()
	require.NoError(t, x.Launch(s))
	time.Sleep(20 * time.Millisecond)
	done, err := s.Query()
	require.NoError(t, err)
	require.False(t, done, "the launch completed before its receive got data")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, toA.TagSend(ctx, []byte("AAAAAAAA"), 1))
	require.NoError(t, s.Synchronize())
	require.Equal(t, "AAAAAAAA", string(bufA))
	require.NoError(t, gc.Destroy())
	require.NoError(t, ra.Wait(ctx))
}
