package tests

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/cgo/cuda"
	"github.com/ucpx/ucpx/condition"
	"github.com/ucpx/ucpx/graph"
	"github.com/ucpx/ucpx/internal/testenv"
	"github.com/ucpx/ucpx/internal/testenv/streamenv"
	"github.com/ucpx/ucpx/stream"
	"github.com/ucpx/ucpx/ucp"
)

// Framework interop (issue 19): completion events that streams the library never saw
// wait on, a lazy device-to-host awaitable and communication nodes in a graph captured
// by someone else. The GPU tests use no test kernels (copies only), so they also run
// against the fake driver (TestGPUInteropFakeDriver).

// interopPattern is n bytes that differ for every (n, i).
func interopPattern(n, i int) []byte {
	b := make([]byte, n)
	for j := range b {
		b[j] = byte(j*7 + i*13 + n)
	}
	return b
}

// The host twin of RecordEvent: a receive enqueued on stream s without stream-ordered
// completion, an event recorded for it, and a second stream that only waits on the
// event and then reads the buffer. The event must not be ready while the sender is
// late (the MPICH #7612 pattern), and the waiting stream must see the message.
func TestRecordEventHostStream(t *testing.T) {
	b := streamenv.HostBackend(t)
	recvW, _, toRecv, _ := shmWorkers(t)
	s, err := b.NewStream()
	require.NoError(t, err)
	defer s.Close()
	other, err := b.NewStream()
	require.NoError(t, err)
	defer other.Close()
	cond, err := condition.Create(condition.Param{Category: condition.Stream, Backend: b, Stream: s})
	require.NoError(t, err)
	defer func() { require.NoError(t, cond.Destroy()) }()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	for i, n := range []int{4, 4096, 1 << 20} {
		buf := make([]byte, n)
		ev, err := b.NewEvent()
		require.NoError(t, err)
		rr, err := recvW.TagRecvNbx(buf, uint64(i), ^uint64(0), &ucp.RequestParam{Condition: cond, Flags: ucp.NonBlockingEnqueue})
		require.NoError(t, err)
		// Request.RecordEvent for the first two, Condition.RecordEvent (everything armed
		// so far) for the last.
		if i < 2 {
			require.NoError(t, rr.RecordEvent(ev))
		} else {
			require.NoError(t, cond.RecordEvent(ev))
		}
		require.NoError(t, other.WaitEvent(ev))
		seen := make(chan []byte, 1)
		require.NoError(t, other.LaunchHostFunc(func() { seen <- append([]byte(nil), buf...) }))
		time.Sleep(200 * time.Millisecond)
		ready, err := ev.Query()
		require.NoError(t, err)
		require.False(t, ready, "size %d: the event is ready before the message was sent", n)
		want := interopPattern(n, i)
		sr, err := toRecv.TagSendNbx(want, uint64(i), nil)
		require.NoError(t, err)
		require.NoError(t, sr.Wait(ctx))
		require.NoError(t, other.Synchronize())
		require.Equal(t, want, <-seen, "size %d: what the waiting stream saw", n)
		require.NoError(t, rr.Wait(ctx))
		require.NoError(t, ev.Synchronize())
		require.NoError(t, ev.Close())
	}
	require.NoError(t, s.Synchronize())

	// Bad input fails at the call.
	ev, err := b.NewEvent()
	require.NoError(t, err)
	defer ev.Close()
	require.ErrorIs(t, cond.RecordEvent(nil), ucp.ErrInvalidParam)
	plain, err := recvW.TagRecvNbx(make([]byte, 4), 99, ^uint64(0), nil)
	require.NoError(t, err)
	require.ErrorIs(t, plain.RecordEvent(ev), ucp.ErrInvalidParam, "no condition: no stream")
	plain.Cancel()
	kt, err := condition.Create(condition.Param{Category: condition.KernelTriggered, Backend: b})
	require.NoError(t, err)
	require.ErrorIs(t, kt.RecordEvent(ev), ucp.ErrInvalidParam, "kernel-triggered: no stream")
	require.NoError(t, kt.Destroy())
	require.NoError(t, cond.BeginGroup())
	grp, err := recvW.TagRecvNbx(make([]byte, 4), 98, ^uint64(0), &ucp.RequestParam{Condition: cond})
	require.NoError(t, err)
	require.ErrorIs(t, grp.RecordEvent(ev), ucp.ErrInvalidParam, "open group")
	require.ErrorIs(t, cond.RecordEvent(ev), ucp.ErrInvalidParam, "open group")
	require.NoError(t, cond.EndGroup())
	sr, err := toRecv.TagSendNbx([]byte("done"), 98, nil)
	require.NoError(t, err)
	require.NoError(t, sr.Wait(ctx))
	require.NoError(t, grp.Wait(ctx))
	require.NoError(t, s.Synchronize())
}

// cudaEnv is a CUDA backend, its context and a raw stream of that context made through
// cgo/cuda as a foreign library would (not through package stream).
func cudaEnv(t *testing.T) (stream.Backend, *cuda.Context, *cuda.Stream) {
	t.Helper()
	b := streamenv.CUDABackend(t)
	ctx, _, ok := stream.CUDAContext(b)
	require.True(t, ok)
	foreign, err := ctx.NewStream(cuda.StreamNonBlocking, 0)
	require.NoError(t, err)
	t.Cleanup(func() { _ = foreign.Close() })
	return b, ctx, foreign
}

// Item 1 on a GPU: a receive into device memory on the condition's stream (stream
// ordered: where UCX cannot move device memory it is staged, and the staged copy-in is
// stream work after the completion, as on torch's stream in the PyTorch script), a raw
// CUevent created through the driver and adopted, and a foreign CUstream that only
// waits on that event before copying the buffer to the host. The event must not be
// ready while the sender is 200 ms late; the copy must see the message.
func TestGPURecordEventForeignStream(t *testing.T) {
	b, ctx, foreign := cudaEnv(t)
	recvW, _, toRecv, _ := shmWorkers(t)
	s, err := b.NewStream()
	require.NoError(t, err)
	defer s.Close()
	cond, err := condition.Create(condition.Param{Category: condition.Stream, Backend: b, Stream: s})
	require.NoError(t, err)
	defer func() { require.NoError(t, cond.Destroy()) }()
	raw, err := ctx.NewEvent(cuda.EventDisableTiming)
	require.NoError(t, err)
	defer raw.Close()
	ev, err := stream.WrapCUDAEvent(s, raw.Handle())
	require.NoError(t, err)
	defer ev.Close()
	wctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	for i, n := range []int{4, 65536, 4 << 20} {
		dev, err := ctx.MemAlloc(n)
		require.NoError(t, err)
		host, err := ctx.MemHostAlloc(n, cuda.HostAllocPortable)
		require.NoError(t, err)
		clear(host.Bytes())
		rr, err := recvW.TagRecvNbx(ucp.DeviceBuffer(dev.Ptr(), n), uint64(i), ^uint64(0),
			&ucp.RequestParam{Condition: cond, MemoryType: ucp.MemoryCUDA})
		require.NoError(t, err)
		if i%2 == 0 {
			require.NoError(t, rr.RecordEvent(ev))
		} else {
			require.NoError(t, cond.RecordEvent(ev))
		}
		// The foreign stream knows nothing but the raw event.
		require.NoError(t, foreign.WaitEvent(raw))
		require.NoError(t, foreign.MemcpyDtoH(host.Addr(), dev.Ptr(), n))
		time.Sleep(200 * time.Millisecond)
		ready, err := raw.Query()
		require.NoError(t, err)
		require.False(t, ready, "size %d: the event recorded after the enqueue is ready before the peer sent", n)
		want := interopPattern(n, i)
		sr, err := toRecv.TagSendNbx(want, uint64(i), nil)
		require.NoError(t, err)
		require.NoError(t, sr.Wait(wctx))
		require.NoError(t, rr.Wait(wctx))
		require.NoError(t, foreign.Synchronize())
		require.Equal(t, want, host.Bytes(), "size %d: what the foreign stream copied", n)
		require.NoError(t, s.Synchronize())
		require.NoError(t, dev.Close())
		require.NoError(t, host.Close())
	}
	require.NoError(t, cond.Err())
	// Under capture the wait would name a sequence number a relaunched graph never sees.
	cs, _ := stream.CUDAStream(s)
	require.NoError(t, cs.BeginCapture(cuda.CaptureRelaxed))
	require.ErrorIs(t, cond.RecordEvent(ev), ucp.ErrInvalidParam)
	captured, err := cs.EndCapture()
	require.NoError(t, err)
	require.NoError(t, captured.Close())
	hs, err := streamenv.HostBackend(t).NewStream()
	require.NoError(t, err)
	defer hs.Close()
	_, err = stream.WrapCUDAEvent(hs, raw.Handle())
	require.ErrorIs(t, err, stream.ErrWrongBackend)
	_, err = stream.WrapCUDAEvent(s, 0)
	require.ErrorIs(t, err, ucp.ErrInvalidParam)
}

// Item 2 on a GPU: the copy is held behind a gate word on the stream, so the call must
// return (and Ready say false) before the data exists; after the gate opens, Wait and
// Bytes give the device's bytes. Work enqueued after the copy does not delay Wait.
func TestGPUCopyToHostAsync(t *testing.T) {
	b, ctx, _ := cudaEnv(t)
	s, err := b.NewStream()
	require.NoError(t, err)
	defer s.Close()
	words, err := b.AllocWords(2)
	require.NoError(t, err)
	defer words.Close()
	gate, later := words.Word(0), words.Word(1)
	const n = 1 << 20
	want := interopPattern(n, 5)
	dev, err := ctx.MemAlloc(n)
	require.NoError(t, err)
	defer dev.Close()
	cs, _ := stream.CUDAStream(s)
	src, err := ctx.MemHostAlloc(n, cuda.HostAllocPortable)
	require.NoError(t, err)
	defer src.Close()
	copy(src.Bytes(), want)
	require.NoError(t, cs.MemcpyHtoD(dev.Ptr(), src.Addr(), n))
	dst, err := ctx.MemHostAlloc(n, cuda.HostAllocPortable)
	require.NoError(t, err)
	defer dst.Close()
	clear(dst.Bytes())

	require.NoError(t, s.WaitValue(gate, 1, stream.GEQ))
	a, err := stream.CopyToHostAsync(s, dst.Addr(), dev.Ptr(), n)
	require.NoError(t, err)
	require.NoError(t, s.WaitValue(later, 1, stream.GEQ)) // never opened before Wait
	ready, err := a.Ready()
	require.NoError(t, err)
	require.False(t, ready, "the copy cannot have run: the stream waits on the gate")
	require.Equal(t, make([]byte, n), dst.Bytes(), "no data before the gate opens")
	short, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	require.ErrorIs(t, a.Wait(short), context.DeadlineExceeded)
	cancel()
	gate.Store(1)
	words.Ring()
	got, err := a.Bytes()
	require.NoError(t, err)
	require.Equal(t, want, got)
	require.NoError(t, a.Wait(context.Background()))
	later.Store(1)
	words.Ring()
	require.NoError(t, s.Synchronize())

	_, err = stream.CopyToHostAsync(s, dst.Addr(), dev.Ptr(), 0)
	require.ErrorIs(t, err, stream.ErrInvalidArgument)
	_, err = stream.CopyToHostAsync(nil, dst.Addr(), dev.Ptr(), n)
	require.ErrorIs(t, err, stream.ErrInvalidArgument)
}

// selfProgressingSender returns two workers of one context connected by address, the
// sender's with a progress thread (nothing on the host calls it).
func selfProgressingSender(t *testing.T) (recvW, sendW *ucp.Worker, toRecv, toSend *ucp.Endpoint) {
	t.Helper()
	return shmWorkersWith(t, ucp.WorkerParams{ProgressThread: true})
}

// Item 3: a graph captured from a foreign stream by the test (cgo/cuda's capture API,
// as a framework captures), adopted by its raw CUgraph handle, given a graph
// condition's send and a prepared partitioned send after the captured copies, then
// instantiated and launched 100 times by its owner; the receiver checks every launch.
func TestGPUAdoptCUDAGraph(t *testing.T) {
	b, ctx, foreign := cudaEnv(t)
	// Nothing of the host runs per launch on the sending side: its worker progresses itself.
	recvW, sendW, toRecv, toSend := selfProgressingSender(t)

	const n, parts = 4096, 4
	g := &gpu{backend: b, ctx: ctx}
	srcA, outA, srcB, outB := g.mapped(t, n), g.mapped(t, n), g.mapped(t, n), g.mapped(t, n)
	devA, err := ctx.MemAlloc(n)
	require.NoError(t, err)
	defer devA.Close()
	devB, err := ctx.MemAlloc(n)
	require.NoError(t, err)
	defer devB.Close()
	rbufB := make([]byte, n)
	send, recv := preparedPair(t, g, sendW, recvW, toRecv, toSend, outB.Bytes(), rbufB, parts, parts, 0x19)

	// The "framework": capture two device-to-host copies on its own stream into a graph
	// it owns.
	require.NoError(t, foreign.BeginCapture(cuda.CaptureRelaxed))
	require.NoError(t, foreign.MemcpyDtoH(outA.Addr(), devA.Ptr(), n))
	require.NoError(t, foreign.MemcpyDtoH(outB.Addr(), devB.Ptr(), n))
	owned, err := foreign.EndCapture()
	require.NoError(t, err)
	defer owned.Close()
	nodes, err := owned.Nodes()
	require.NoError(t, err)
	require.Len(t, nodes, 2)
	// The communication follows both copies (as raw handles, all a framework hands over).
	copies := []condition.Node{cuda.NodeFromHandle(nodes[0].Handle()), cuda.NodeFromHandle(nodes[1].Handle())}

	// ucpx sees only the raw handles.
	adopted, err := graph.AdoptCUDA(owned.Handle(), b)
	require.NoError(t, err)
	defer adopted.Graph.Close()
	gc, err := condition.Create(condition.Param{Category: condition.Graph, Backend: b, Graph: adopted,
		Deps: copies})
	require.NoError(t, err)
	defer func() { require.NoError(t, gc.Destroy()) }()
	_, err = toRecv.TagSendNbx(outA.Bytes(), 0x1900, &ucp.RequestParam{Condition: gc})
	require.NoError(t, err)
	for p := range parts {
		_, err := send.PreadyNode(adopted, copies, p)
		require.NoError(t, err)
	}
	x, err := owned.Instantiate(0)
	require.NoError(t, err)
	defer x.Close()

	wctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	launches := 100
	rbufA := make([]byte, n)
	for i := 1; i <= launches; i++ {
		wantA, wantB := interopPattern(n, 2*i), interopPattern(n, 2*i+1)
		copy(srcA.Bytes(), wantA)
		copy(srcB.Bytes(), wantB)
		// The launch's input, in stream order before it (outside the graph).
		require.NoError(t, foreign.MemcpyHtoD(devA.Ptr(), srcA.Addr(), n))
		require.NoError(t, foreign.MemcpyHtoD(devB.Ptr(), srcB.Addr(), n))
		rr, err := recvW.TagRecvNbx(rbufA, 0x1900, ^uint64(0), nil)
		require.NoError(t, err)
		require.NoError(t, recv.Start())
		require.NoError(t, x.Launch(foreign))
		require.NoError(t, rr.Wait(wctx), "launch %d: graph condition's send", i)
		require.NoError(t, recv.Wait(wctx), "launch %d: prepared partitions", i)
		require.NoError(t, foreign.Synchronize())
		if string(rbufA) != string(wantA) || string(rbufB) != string(wantB) {
			require.FailNow(t, fmt.Sprintf("launch %d: received data differs", i))
		}
	}
	require.NoError(t, gc.Err())

	_, err = graph.AdoptCUDA(0, b)
	require.ErrorIs(t, err, graph.ErrInvalidParam)
	_, err = graph.AdoptCUDA(owned.Handle(), streamenv.HostBackend(t))
	require.ErrorIs(t, err, graph.ErrInvalidParam)
}

// TestGPUInteropFakeDriver runs the GPU interop tests against the CPU emulation of the
// driver where there is no GPU, so their logic runs in CI; the GPU run proves the rest.
func TestGPUInteropFakeDriver(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a child process against the fake driver")
	}
	testenv.RunUnderFakeDriver(t, []string{"TestGPURecordEventForeignStream", "TestGPUCopyToHostAsync", "TestGPUAdoptCUDAGraph"})
}
