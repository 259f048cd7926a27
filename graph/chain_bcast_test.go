package graph_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/condition"
	"github.com/ucpx/ucpx/graph"
	"github.com/ucpx/ucpx/stream"
	"github.com/ucpx/ucpx/ucp"
)

// The broadcast of BenchmarkBroadcast3 in one process, every member a chained graph:
// A [send to B, receive B's echo], B [receive] -> [forward to C, echo to A], C
// [receive]; each member's launches on its own host stream, 2000 of them.
func TestGraphChainedBroadcast(t *testing.T) {
	const launches = 2000
	backend := stream.NewHostBackend()
	defer backend.Close()
	ws := make([]*ucp.Worker, 3)
	addrs := make([][]byte, 3)
	for i := range ws {
		c, err := ucp.NewContext(ucp.ContextParams{})
		require.NoError(t, err)
		defer c.Close()
		ws[i], err = c.NewWorker(ucp.WorkerParams{})
		require.NoError(t, err)
		addrs[i], err = ws[i].Address()
		require.NoError(t, err)
	}
	ep := func(from, to int) *ucp.Endpoint {
		e, err := ws[from].ConnectAddress(addrs[to], &ucp.EndpointParams{NoPeerErrorHandling: true})
		require.NoError(t, err)
		return e
	}
	ab, ba, bc := ep(0, 1), ep(1, 0), ep(1, 2)
	node := func(g *graph.Host, deps ...condition.Node) *condition.Condition {
		c, err := bcastComm(g, backend, deps...)
		require.NoError(t, err)
		return c
	}
	out, echo, bbuf, cbuf := []byte("8 bytes!"), make([]byte, 8), make([]byte, 8), make([]byte, 8)
	ga, gb, gc := graph.NewHost(), graph.NewHost(), graph.NewHost()
	aSend, aRecv := node(ga), node(ga)
	_, err := ab.TagSendNbx(out, 1, &ucp.RequestParam{Condition: aSend})
	require.NoError(t, err)
	_, err = ws[0].TagRecvNbx(echo, 2, ^uint64(0), &ucp.RequestParam{Condition: aRecv})
	require.NoError(t, err)
	bRecv := node(gb)
	_, err = ws[1].TagRecvNbx(bbuf, 1, ^uint64(0), &ucp.RequestParam{Condition: bRecv})
	require.NoError(t, err)
	bFwd, bEcho := node(gb, bRecv.WaitNode()), node(gb, bRecv.WaitNode())
	_, err = bc.TagSendNbx(bbuf, 3, &ucp.RequestParam{Condition: bFwd})
	require.NoError(t, err)
	_, err = ba.TagSendNbx(bbuf, 2, &ucp.RequestParam{Condition: bEcho})
	require.NoError(t, err)
	cRecv := node(gc)
	_, err = ws[2].TagRecvNbx(cbuf, 3, ^uint64(0), &ucp.RequestParam{Condition: cRecv})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var xs []*graph.HostExec
	var ss []stream.Stream
	var enqueued sync.WaitGroup
	for _, g := range []*graph.Host{gc, gb, ga} {
		x, err := g.Instantiate()
		require.NoError(t, err)
		s, err := backend.NewStream()
		require.NoError(t, err)
		xs, ss = append(xs, x), append(ss, s)
		enqueued.Add(1)
		go func() {
			defer enqueued.Done()
			for range launches {
				if err := x.Launch(s); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	enqueued.Wait()
	for i, s := range ss {
		require.NoError(t, syncErr(t, ctx, s), "member %d", i)
	}
	for _, x := range xs {
		require.Equal(t, uint64(launches), graph.ChainedLaunches(x))
	}
	require.Equal(t, out, echo)
	require.Equal(t, out, cbuf)
	for _, x := range xs {
		require.NoError(t, x.Close())
	}
	for _, c := range []*condition.Condition{aSend, aRecv, bRecv, bFwd, bEcho, cRecv} {
		require.NoError(t, c.Err())
		require.NoError(t, c.Destroy())
	}
}
