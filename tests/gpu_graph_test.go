package tests

import (
	"context"
	"encoding/binary"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/cgo/cuda"
	"github.com/ucpx/ucpx/condition"
	"github.com/ucpx/ucpx/graph"
	"github.com/ucpx/ucpx/stream"
	"github.com/ucpx/ucpx/ucp"
)

// CUDA graphs with communication nodes, each instantiated once and launched 1000 times
// with no host call per launch: sender [fill kernel -> send], receiver [memset 0 ->
// receive -> checksum kernel accumulating]. The accumulated checksum proves every
// launch delivered the whole payload.
func TestGPUGraphConditionRelaunch(t *testing.T) {
	g := requireGPU(t)
	recvW, _, toRecv, _ := shmWorkers(t)
	const n, launches, seed = 64 << 10, 1000, 7
	out := g.mapped(t, n)
	in := g.mapped(t, n)
	acc := g.mapped(t, 8)

	sg, err := g.ctx.NewGraph()
	require.NoError(t, err)
	defer sg.Close()
	fill, err := sg.AddKernelNode(nil, g.fill, cuda.Linear(64, 256), out.DevicePtr(), uint64(n), uint32(seed))
	require.NoError(t, err)
	send, err := condition.Create(condition.Param{Category: condition.Graph, Backend: g.backend, Graph: graph.CUDA{Graph: sg}, Deps: []condition.Node{fill}})
	require.NoError(t, err)
	_, err = toRecv.TagSendNbx(out.Bytes(), 5, &ucp.RequestParam{Condition: send})
	require.NoError(t, err)

	rg, err := g.ctx.NewGraph()
	require.NoError(t, err)
	defer rg.Close()
	clear, err := rg.AddMemsetNode(nil, in.DevicePtr(), 0, 1, n)
	require.NoError(t, err)
	recv, err := condition.Create(condition.Param{Category: condition.Graph, Backend: g.backend, Graph: graph.CUDA{Graph: rg}, Deps: []condition.Node{clear}})
	require.NoError(t, err)
	_, err = recvW.TagRecvNbx(in.Bytes(), 5, ^uint64(0), &ucp.RequestParam{Condition: recv})
	require.NoError(t, err)
	_, err = rg.AddKernelNode(mustCUDANodes(t, recv.WaitNode()), g.checksum, cuda.Linear(64, 256), in.DevicePtr(), uint64(n), acc.DevicePtr())
	require.NoError(t, err)

	sx, err := sg.Instantiate(0)
	require.NoError(t, err)
	defer sx.Close()
	rx, err := rg.Instantiate(0)
	require.NoError(t, err)
	defer rx.Close()
	ss, err := g.backend.NewStream()
	require.NoError(t, err)
	defer ss.Close()
	rs, err := g.backend.NewStream()
	require.NoError(t, err)
	defer rs.Close()
	launchGraphPair(t, ss, rs, sx, rx, launches, acc, n, seed, send, recv)
}

// Stream capture of stream conditions: a sender stream [fill kernel, send] and a
// receiver stream [clear, receive, checksum kernel] are captured into CUDA graphs,
// instantiated once and launched 1000 times. The captured operations run at every
// launch; the device checksum accumulated over all launches proves each delivered.
func TestGPUStreamCaptureConditions(t *testing.T) {
	g := requireGPU(t)
	recvW, _, toRecv, _ := shmWorkers(t)
	const n, launches, seed = 64 << 10, 1000, 3
	out := g.mapped(t, n)
	in := g.mapped(t, n)
	acc := g.mapped(t, 8)
	ss, rs := g.stream(t), g.stream(t)
	scs, _ := stream.CUDAStream(ss)
	rcs, _ := stream.CUDAStream(rs)
	sendCond, err := condition.Create(condition.Param{Category: condition.Stream, Backend: g.backend, Stream: ss})
	require.NoError(t, err)
	recvCond, err := condition.Create(condition.Param{Category: condition.Stream, Backend: g.backend, Stream: rs})
	require.NoError(t, err)

	require.NoError(t, scs.BeginCapture(cuda.CaptureRelaxed))
	require.NoError(t, scs.LaunchKernel(g.fill, cuda.Linear(64, 256), out.DevicePtr(), uint64(n), uint32(seed)))
	_, err = toRecv.TagSendNbx(out.Bytes(), 6, &ucp.RequestParam{Condition: sendCond})
	require.NoError(t, err)
	// A non-blocking enqueue has nothing to wait for in a relaunched graph: refused.
	_, err = toRecv.TagSendNbx(out.Bytes(), 6, &ucp.RequestParam{Condition: sendCond, Flags: ucp.NonBlockingEnqueue})
	require.ErrorIs(t, err, condition.ErrInvalidParam, "non-blocking enqueue under capture")
	sg, err := scs.EndCapture()
	require.NoError(t, err)
	defer sg.Close()

	require.NoError(t, rcs.BeginCapture(cuda.CaptureRelaxed))
	require.NoError(t, rcs.MemsetD8(in.DevicePtr(), 0, n))
	_, err = recvW.TagRecvNbx(in.Bytes(), 6, ^uint64(0), &ucp.RequestParam{Condition: recvCond})
	require.NoError(t, err)
	require.NoError(t, rcs.LaunchKernel(g.checksum, cuda.Linear(64, 256), in.DevicePtr(), uint64(n), acc.DevicePtr()))
	rg, err := rcs.EndCapture()
	require.NoError(t, err)
	defer rg.Close()
	require.Zero(t, sendCond.Pending()+recvCond.Pending(), "captured operations counted as pending on the stream conditions")
	for name, gr := range map[string]*cuda.Graph{"sender": sg, "receiver": rg} {
		ns, err := gr.Nodes()
		require.NoError(t, err)
		memops := 0
		for _, nd := range ns {
			if ty, _ := gr.NodeType(nd); ty == cuda.NodeBatchMemOp {
				memops++
			}
		}
		require.Positive(t, memops, "%s graph: no batch-memop node among %d captured nodes", name, len(ns))
	}

	sx, err := sg.Instantiate(0)
	require.NoError(t, err)
	rx, err := rg.Instantiate(0)
	require.NoError(t, err)
	launchGraphPair(t, ss, rs, sx, rx, launches, acc, n, seed, sendCond, recvCond)
}

// A CUDA graph whose peer dies: the launch waiting on the dead peer's receive
// completes (the stream is released) with the error in the condition, and later
// launches complete too instead of blocking.
func TestGPUGraphPeerDies(t *testing.T) {
	g := requireGPU(t)
	p := spawnPeer(t, "tcp")
	const n, tag = 4096, 0x5151
	in := g.mapped(t, n)
	acc := g.mapped(t, 8)
	cg, err := g.ctx.NewGraph()
	require.NoError(t, err)
	defer cg.Close()
	recv, err := condition.Create(condition.Param{Category: condition.Graph, Backend: g.backend, Graph: graph.CUDA{Graph: cg}})
	require.NoError(t, err)
	rr, err := p.w.TagRecvNbx(in.Bytes(), tag|tagReply, ^uint64(0), &ucp.RequestParam{Condition: recv, Peer: p.ep})
	require.NoError(t, err)
	_, err = cg.AddKernelNode(mustCUDANodes(t, recv.WaitNode()), g.checksum, cuda.Linear(4, 256), in.DevicePtr(), uint64(n), acc.DevicePtr())
	require.NoError(t, err)
	x, err := cg.Instantiate(0)
	require.NoError(t, err)
	s, err := g.backend.NewStream()
	require.NoError(t, err)
	defer s.Close()
	cs, _ := stream.CUDAStream(s)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// Launch 1: the peer echoes a message into the graph's receive.
	src := pattern(n, 9)
	require.NoError(t, x.Launch(cs))
	require.NoError(t, send(ctx, p.ep, src, tag))
	require.NoError(t, s.Synchronize())
	require.Equal(t, byteSum(src), binary.LittleEndian.Uint64(acc.Bytes()), "launch 1 checksum")
	require.NoError(t, recv.Err())

	// Launch 2 waits on a receive from a peer that now dies.
	require.NoError(t, x.Launch(cs))
	ev, err := g.backend.NewEvent()
	require.NoError(t, err)
	defer ev.Close()
	require.NoError(t, s.Record(ev))
	time.Sleep(20 * time.Millisecond)
	finished, err := ev.Query()
	require.NoError(t, err, "launch 2")
	require.False(t, finished, "launch 2 finished before the peer died")
	killPeerAndAwait(ctx, t, p, ev, "graph launch")
	require.ErrorIs(t, recv.Err(), ucp.ErrPeerFailed, "condition error")
	// Launch 3 finds the endpoint failed and completes at once.
	require.NoError(t, x.Launch(cs))
	done := make(chan error, 1)
	go func() { done <- s.Synchronize() }()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-ctx.Done():
		require.FailNow(t, "launch after the peer died blocked the stream")
	}
	require.NoError(t, x.Close())
	require.NoError(t, recv.Destroy())
	require.ErrorIs(t, rr.Wait(ctx), ucp.ErrPeerFailed, "graph operation's request")
	_ = p.exit()
}

// requireAccumulated checks a device checksum word that added the fill pattern of n
// bytes (seed) once per launch.
// launchGraphPair launches the receiver's graph rx on rs and the sender's sx on ss,
// launches times, then checks the device checksum accumulated over the launches and that
// no condition met an error, and closes the graphs and destroys the conditions.
func launchGraphPair(t *testing.T, ss, rs stream.Stream, sx, rx *cuda.GraphExec, launches int, acc *cuda.HostMemory, n int, seed uint32, conds ...*condition.Condition) {
	t.Helper()
	scs, _ := stream.CUDAStream(ss)
	rcs, _ := stream.CUDAStream(rs)
	for i := 0; i < launches; i++ {
		require.NoError(t, rx.Launch(rcs))
		require.NoError(t, sx.Launch(scs))
	}
	require.NoError(t, ss.Synchronize())
	require.NoError(t, rs.Synchronize())
	requireAccumulated(t, acc, launches, n, seed)
	for _, c := range conds {
		require.NoError(t, c.Err())
	}
	require.NoError(t, sx.Close())
	require.NoError(t, rx.Close())
	for _, c := range conds {
		require.NoError(t, c.Destroy())
	}
}

func requireAccumulated(t *testing.T, acc *cuda.HostMemory, launches, n int, seed uint32) {
	t.Helper()
	require.Equal(t, uint64(launches)*fillSum(n, seed), binary.LittleEndian.Uint64(acc.Bytes()), "accumulated checksum over %d launches", launches)
}

// mustCUDANodes converts condition nodes of a CUDA graph for cgo/cuda's graph calls.
func mustCUDANodes(t testing.TB, ns ...condition.Node) []cuda.Node {
	out, err := graph.CUDANodes(ns...)
	require.NoError(t, err)
	return out
}
