package tests

import (
	"context"
	"encoding/binary"
	"fmt"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/cgo/cuda"
	"github.com/ucpx/ucpx/condition"
	"github.com/ucpx/ucpx/device"
	"github.com/ucpx/ucpx/graph"
	"github.com/ucpx/ucpx/prepare"
	"github.com/ucpx/ucpx/stream"
	"github.com/ucpx/ucpx/ucp"
)

// The device side of prepared partitions: kernels make partitions ready
// (ucpx_pready_block) and wait for their arrival (ucpx_parrived_wait_block) through
// prepare.Request.DeviceHandle. The partitioned buffers are host-mapped pinned memory
// (cuMemHostAlloc DEVICEMAP): the puts of a kernel-triggered condition are issued by
// the CPU, and device buffers under KernelTriggered conditions are refused
// (ErrUnsupported) until the transport moves device memory itself (CUDA-IPC).

// kernel looks up a test kernel by name.
func (g *gpu) kernel(t testing.TB, name string) *cuda.Function {
	t.Helper()
	f, err := g.module.Function(name)
	require.NoError(t, err, "kernel %s", name)
	return f
}

// preparedPair makes a partitioned send of sbuf on sendW and its receive into rbuf on
// recvW (CUDA backend), prepared together and freed when the test ends.
func preparedPair(t *testing.T, g *gpu, sendW, recvW *ucp.Worker, toRecv, toSend *ucp.Endpoint, sbuf, rbuf []byte, sparts, rparts int, tag uint64) (send, recv *prepare.Request) {
	return preparedPairOf(t, g, sendW, recvW, toRecv, toSend, sbuf, rbuf, sparts, rparts, tag, ucp.MemoryHost)
}

// preparedPairOf is preparedPair with buffers of memory type mt.
func preparedPairOf(t *testing.T, g *gpu, sendW, recvW *ucp.Worker, toRecv, toSend *ucp.Endpoint, sbuf, rbuf []byte, sparts, rparts int, tag uint64, mt ucp.MemoryType) (send, recv *prepare.Request) {
	t.Helper()
	var err error
	send, err = prepare.PsendInit(sendW, sbuf, prepare.Params{Peer: toRecv, Tag: tag, Partitions: sparts, Backend: g.backend, MemoryType: mt})
	require.NoError(t, err)
	recv, err = prepare.PrecvInit(recvW, rbuf, prepare.Params{Peer: toSend, Tag: tag, Partitions: rparts, Backend: g.backend, MemoryType: mt})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// One call progresses both workers.
	require.NoError(t, prepare.PrepareAll(ctx, send, recv))
	t.Cleanup(func() {
		_ = send.Free()
		_ = recv.Free()
	})
	return send, recv
}

// tcpWorkers returns two workers of one process, each with its own context, connected
// over tcp (peer error handling: closing one fails the other's endpoint).
func tcpWorkers(t *testing.T) (recvW, sendW *ucp.Worker, toRecv, toSend *ucp.Endpoint) {
	t.Helper()
	return tcpWorkersWith(t, ucp.WorkerParams{})
}

// tcpWorkersWith is tcpWorkers with the sending worker made with sendParams.
func tcpWorkersWith(t *testing.T, sendParams ucp.WorkerParams) (recvW, sendW *ucp.Worker, toRecv, toSend *ucp.Endpoint) {
	t.Helper()
	var ctxs [2]*ucp.Context
	var ws [2]*ucp.Worker
	for i := range ctxs {
		var err error
		ctxs[i], err = ucp.NewContext(ucp.ContextParams{Config: contextConfig("tcp")})
		require.NoError(t, err)
		c := ctxs[i]
		t.Cleanup(func() { _ = c.Close() })
		params := ucp.WorkerParams{}
		if i == 1 {
			params = sendParams
		}
		ws[i], err = ctxs[i].NewWorker(params)
		require.NoError(t, err)
	}
	recvW, sendW = ws[0], ws[1]
	lis, err := recvW.Listen("127.0.0.1:0", nil)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	accepted := make(chan error, 1)
	connected := make(chan struct{})
	go func() {
		var err error
		toSend, err = lis.Accept(ctx, nil)
		accepted <- err
		for {
			select {
			case <-connected:
				return
			default:
				recvW.Progress()
			}
		}
	}()
	toRecv, err = sendW.Connect(ctx, lis.Addr(), nil)
	close(connected)
	require.NoError(t, err)
	require.NoError(t, <-accepted)
	require.NoError(t, lis.Close())
	return recvW, sendW, toRecv, toSend
}

// progressWhile progresses w until stop is called. A put-with-signal's request
// completes once its data is out, and its signal add may still wait in the sender's
// UCX queue for the sender's progress: the sender's Wait can return before the
// receiver can see the partition arrive, and here the sender's host does nothing more
// until the receiver's Wait returns. (An application keeps progressing its worker, or
// gives it WorkerParams.ProgressThread.)
func progressWhile(w *ucp.Worker) (stop func()) {
	return pollWorker(w, func() { time.Sleep(5 * time.Microsecond) })
}

// pollWorker progresses w in a loop, calling idle when nothing progressed, until stop.
func pollWorker(w *ucp.Worker, idle func()) (stop func()) {
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		for {
			select {
			case <-done:
				return
			default:
			}
			if w.Progress() == 0 {
				idle()
			}
		}
	}()
	return func() {
		close(done)
		<-stopped
	}
}

// partSum is the sum of the ucpx_test_fill pattern (seed) over bytes [off, off+n).
func partSum(off, n int, seed uint32) uint64 {
	var s uint64
	for i := off; i < off+n; i++ {
		s += uint64(device.Pattern(uint64(i), seed))
	}
	return s
}

// A producer kernel (block p fills sender partition p, then ucpx_pready_block) and a
// consumer kernel (block q waits with ucpx_parrived_wait_block, then checksums receive
// partition q) run against each other across two workers of one process, on two
// streams, 64 send partitions into 32 receive partitions (each receive partition
// waits for two sender counters), every other iteration with the blocks making their
// partitions ready in reverse order. In the first iteration the consumer is launched
// and seen waiting before the producer exists, and every block's ucpx_pstatus before
// the wait must be UCPX_PART_PENDING.
func TestGPUPreparedKernelPreadyParrived(t *testing.T) {
	g := requireGPU(t)
	const n = 64 * 4096
	out, in := g.mapped(t, n), g.mapped(t, n)
	kernelPreadyParrived(t, g, out.Bytes(), in.Bytes(), out.DevicePtr(), in.DevicePtr(), ucp.MemoryHost)
}

// The same kernels on device buffers (cuMemAlloc): the prepared requests stage each
// partition through a host copy on their own streams (the sender's after
// ucpx_pready, the receiver's before the landed word ucpx_parrived waits for).
func TestGPUPreparedKernelDeviceBuffers(t *testing.T) {
	g := requireGPU(t)
	const n = 64 * 4096
	out, err := g.ctx.MemAlloc(n)
	require.NoError(t, err)
	t.Cleanup(func() { _ = out.Close() })
	in, err := g.ctx.MemAlloc(n)
	require.NoError(t, err)
	t.Cleanup(func() { _ = in.Close() })
	kernelPreadyParrived(t, g, ucp.DeviceBuffer(out.Ptr(), n), ucp.DeviceBuffer(in.Ptr(), n), out.Ptr(), in.Ptr(), ucp.MemoryCUDA)
}

func kernelPreadyParrived(t *testing.T, g *gpu, sbuf, rbuf []byte, outPtr, inPtr uintptr, mt ucp.MemoryType) {
	recvW, sendW, toRecv, toSend := shmWorkers(t)
	const sparts, rparts, partBytes = 64, 32, 4096
	const n = sparts * partBytes
	const rpartBytes = n / rparts
	iters := 200
	if testing.Short() {
		iters = 20
	}
	sums, status, failures := g.mapped(t, 8*rparts), g.mapped(t, 16*rparts), g.mapped(t, 8)
	send, recv := preparedPairOf(t, g, sendW, recvW, toRecv, toSend, sbuf, rbuf, sparts, rparts, 0x61, mt)
	pready, parrived := g.kernel(t, device.KernelPready), g.kernel(t, device.KernelParrived)
	ss, rs := g.stream(t), g.stream(t)
	scs, _ := stream.CUDAStream(ss)
	rcs, _ := stream.CUDAStream(rs)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	clear(failures.Bytes())
	start := time.Now()
	for it := 1; it <= iters; it++ {
		seed := uint32(it * 7919)
		clear(sums.Bytes())
		clear(status.Bytes())
		require.NoError(t, recv.Start())
		rh, err := recv.DeviceHandle()
		require.NoError(t, err)
		require.EqualValues(t, it, rh.Iteration)
		require.NoError(t, rcs.LaunchKernel(parrived, cuda.Linear(rparts, 256), rh.Kernel(), inPtr, sums.DevicePtr(), status.DevicePtr()))
		if it == 1 {
			time.Sleep(50 * time.Millisecond)
			done, err := rs.Query()
			require.NoError(t, err)
			require.False(t, done, "the consumer finished before anything was sent")
		}
		require.NoError(t, send.Start())
		sh, err := send.DeviceHandle()
		require.NoError(t, err)
		reverse := uint32(it % 2)
		require.NoError(t, scs.LaunchKernel(pready, cuda.Linear(sparts, 256), sh.Kernel(), outPtr, seed, reverse, failures.DevicePtr()))
		sendDone := make(chan error, 1)
		go func() { sendDone <- send.Wait(ctx) }()
		stop := progressWhile(sendW)
		ictx, icancel := context.WithTimeout(ctx, 30*time.Second)
		err = recv.Wait(ictx)
		icancel()
		stop()
		if err != nil {
			dumpPartitionWords(t, g, sh, rh)
		}
		require.NoError(t, err, "iteration %d: receive", it)
		require.NoError(t, <-sendDone, "iteration %d: send", it)
		require.NoError(t, ss.Synchronize())
		require.NoError(t, rs.Synchronize())
		require.Zero(t, binary.LittleEndian.Uint64(failures.Bytes()), "iteration %d: ucpx_pready reported failures", it)
		st, sm := status.Bytes(), sums.Bytes()
		for q := range rparts {
			if it == 1 {
				require.Equal(t, device.PartPending, int64(binary.LittleEndian.Uint64(st[16*q:])), "iteration 1 partition %d: ucpx_pstatus before anything was sent", q)
			}
			require.EqualValues(t, 1, binary.LittleEndian.Uint64(st[16*q+8:]), "iteration %d partition %d: ucpx_parrived_wait_block", it, q)
			require.Equal(t, partSum(q*rpartBytes, rpartBytes, seed), binary.LittleEndian.Uint64(sm[8*q:]), "iteration %d partition %d: device checksum", it, q)
		}
	}
	t.Logf("%d iterations of %d partitions (%d bytes) in %v", iters, sparts, n, time.Since(start))
	require.Equal(t, uint64(1), send.Stats().TagMatches)
	require.Equal(t, uint64(iters), send.Stats().Iterations)
	require.Equal(t, uint64(iters), recv.Stats().Iterations)
	require.Equal(t, uint64(iters*sparts), send.Stats().Puts)
	require.NoError(t, send.Free())
	require.NoError(t, recv.Free())
}

// A dead peer releases kernels: a producer waiting in ucpx_pready for a receiver that
// goes away returns (every block reports failure), and a consumer waiting in
// ucpx_parrived_wait for a sender that goes away returns with UCPX_PART_FAILED; Wait
// reports ucp.ErrPeerFailed on the surviving side. Two workers of one process over
// tcp; closing one worker fails the other's endpoint.
func TestGPUPreparedKernelPeerFails(t *testing.T) {
	g := requireGPU(t)
	const parts, partBytes = 16, 4096
	const n = parts * partBytes
	awaitStream := func(t *testing.T, s stream.Stream, what string) {
		t.Helper()
		done := make(chan error, 1)
		go func() { done <- s.Synchronize() }()
		select {
		case err := <-done:
			require.NoError(t, err, what)
		case <-time.After(30 * time.Second):
			t.Fatalf("%s still waits on the dead peer", what)
		}
	}
	t.Run("receiver dies", func(t *testing.T) {
		recvW, sendW, toRecv, toSend := tcpWorkers(t)
		out, in, failures := g.mapped(t, n), g.mapped(t, n), g.mapped(t, 8)
		clear(failures.Bytes())
		send, _ := preparedPair(t, g, sendW, recvW, toRecv, toSend, out.Bytes(), in.Bytes(), parts, parts, 0x62)
		ss := g.stream(t)
		scs, _ := stream.CUDAStream(ss)
		require.NoError(t, send.Start())
		sh, err := send.DeviceHandle()
		require.NoError(t, err)
		require.NoError(t, scs.LaunchKernel(g.kernel(t, device.KernelPready), cuda.Linear(parts, 128), sh.Kernel(), out.DevicePtr(), uint32(1), uint32(0), failures.DevicePtr()))
		time.Sleep(50 * time.Millisecond)
		done, err := ss.Query()
		require.NoError(t, err)
		require.False(t, done, "the producer finished though the receiver never started")
		require.NoError(t, recvW.Close())
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		require.ErrorIs(t, send.Wait(ctx), ucp.ErrPeerFailed)
		awaitStream(t, ss, "the producer kernel")
		require.EqualValues(t, parts, binary.LittleEndian.Uint64(failures.Bytes()), "blocks that saw the failure")
		require.NoError(t, send.Free(), "the armed puts were canceled")
	})
	t.Run("sender dies", func(t *testing.T) {
		recvW, sendW, toRecv, toSend := tcpWorkers(t)
		out, in := g.mapped(t, n), g.mapped(t, n)
		sums, status := g.mapped(t, 8*parts), g.mapped(t, 16*parts)
		clear(status.Bytes())
		_, recv := preparedPair(t, g, sendW, recvW, toRecv, toSend, out.Bytes(), in.Bytes(), parts, parts, 0x63)
		rs := g.stream(t)
		rcs, _ := stream.CUDAStream(rs)
		require.NoError(t, recv.Start())
		rh, err := recv.DeviceHandle()
		require.NoError(t, err)
		require.NoError(t, rcs.LaunchKernel(g.kernel(t, device.KernelParrived), cuda.Linear(parts, 128), rh.Kernel(), in.DevicePtr(), sums.DevicePtr(), status.DevicePtr()))
		time.Sleep(50 * time.Millisecond)
		done, err := rs.Query()
		require.NoError(t, err)
		require.False(t, done, "the consumer finished though nothing was sent")
		require.NoError(t, sendW.Close())
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		require.ErrorIs(t, recv.Wait(ctx), ucp.ErrPeerFailed)
		awaitStream(t, rs, "the consumer kernel")
		for q := range parts {
			require.EqualValues(t, 2, binary.LittleEndian.Uint64(status.Bytes()[16*q+8:]), "partition %d: the consumer block did not see the failure", q)
		}
		require.NoError(t, recv.Free())
	})
}

// PreadyNode in a CUDA graph: [tick (launch counter) -> fill partition p -> PreadyNode
// p] for each partition, instantiated once and launched 1000 times with no host call
// per launch on the sending side; the receiver starts each iteration on the host and
// checks every byte of it (the fill's seed is the launch number). Nothing on the host
// calls the sender's worker: the receiver's readiness write may need its progress
// (RMA emulated through active messages), so it has a progress thread.
func TestGPUPreparedPreadyNodeRelaunch(t *testing.T) {
	g := requireGPU(t)
	recvW, sendW, toRecv, toSend := selfProgressingSender(t)

	const parts, partBytes = 8, 8192
	const n = parts * partBytes
	launches := 1000
	if testing.Short() {
		launches = 100
	}
	out := g.mapped(t, n)
	counter := g.mapped(t, 8)
	clear(counter.Bytes())
	rbuf := make([]byte, n)
	send, recv := preparedPair(t, g, sendW, recvW, toRecv, toSend, out.Bytes(), rbuf, parts, parts, 0x64)

	cg, err := g.ctx.NewGraph()
	require.NoError(t, err)
	defer cg.Close()
	tick, err := cg.AddKernelNode(nil, g.kernel(t, device.KernelTick), cuda.Linear(1, 1), counter.DevicePtr())
	require.NoError(t, err)
	fillAt := g.kernel(t, device.KernelFillAt)
	for p := range parts {
		off := p * partBytes
		fill, err := cg.AddKernelNode([]cuda.Node{tick}, fillAt, cuda.Linear(8, 256), out.DevicePtr()+uintptr(off), uint64(partBytes), uint64(off), counter.DevicePtr())
		require.NoError(t, err)
		_, err = send.PreadyNode(graph.CUDA{Graph: cg}, []condition.Node{fill}, p)
		require.NoError(t, err)
	}
	x, err := cg.Instantiate(0)
	require.NoError(t, err)
	s := g.stream(t)
	cs, _ := stream.CUDAStream(s)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// The receiver runs every iteration even past a wrong byte (reported at the end),
	// so the sender's launches are never left waiting for readiness.
	type result struct {
		iters int
		bad   error
		err   error
	}
	recvDone := make(chan result, 1)
	go func() {
		var res result
		for i := 1; i <= launches; i++ {
			if res.err = recv.Start(); res.err != nil {
				break
			}
			if res.err = recv.Wait(ctx); res.err != nil {
				break
			}
			res.iters = i
			for j := range rbuf {
				if want := device.Pattern(uint64(j), uint32(i)); rbuf[j] != want && res.bad == nil {
					res.bad = fmt.Errorf("launch %d: byte %d is %d, want %d", i, j, rbuf[j], want)
				}
			}
		}
		recvDone <- res
	}()
	start := time.Now()
	launched := make(chan error, 1)
	go func() {
		for range launches {
			if err := x.Launch(cs); err != nil {
				launched <- err
				return
			}
		}
		launched <- nil
	}()
	res := <-recvDone
	require.NoError(t, res.err, "receiver: %d iterations completed, %d launches ticked", res.iters, binary.LittleEndian.Uint64(counter.Bytes()))
	require.NoError(t, res.bad)
	require.NoError(t, <-launched)
	require.NoError(t, s.Synchronize())
	t.Logf("%d launches of %d partitions in %v", launches, parts, time.Since(start))
	require.EqualValues(t, launches, binary.LittleEndian.Uint64(counter.Bytes()))
	require.NoError(t, x.Close())
	require.NoError(t, send.Free())
	require.NoError(t, recv.Free())
	require.Equal(t, uint64(launches), recv.Stats().Iterations)
}

// A CUDA graph of PreadyNode partitions (host-mapped buffers: the engine path, whose
// gate takes each ready flag with a memop write of 0) whose receiver goes away after
// some launches: later launches still complete (the failure value is kept in the
// flags the gates clear), so the graph's stream is not left waiting on the dead peer,
// and Wait reports ucp.ErrPeerFailed. Two workers of one process over tcp.
func TestGPUPreparedPreadyNodePeerFails(t *testing.T) {
	g := requireGPU(t)
	recvW, sendW, toRecv, toSend := tcpWorkersWith(t, ucp.WorkerParams{ProgressThread: true})
	const parts, partBytes = 4, 4096
	out, in := g.mapped(t, parts*partBytes), g.mapped(t, parts*partBytes)
	send, recv := preparedPair(t, g, sendW, recvW, toRecv, toSend, out.Bytes(), in.Bytes(), parts, parts, 0x65)
	cg, err := g.ctx.NewGraph()
	require.NoError(t, err)
	defer cg.Close()
	for p := range parts {
		_, err = send.PreadyNode(graph.CUDA{Graph: cg}, nil, p)
		require.NoError(t, err)
	}
	x, err := cg.Instantiate(0)
	require.NoError(t, err)
	defer x.Close()
	s := g.stream(t)
	cs, _ := stream.CUDAStream(s)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for i := 1; i <= 3; i++ {
		fillPattern(out.Bytes(), byte(i))
		require.NoError(t, recv.Start())
		require.NoError(t, x.Launch(cs))
		require.NoError(t, recv.Wait(ctx), "iteration %d", i)
		require.Equal(t, makePattern(len(in.Bytes()), byte(i)), in.Bytes(), "iteration %d", i)
		require.NoError(t, s.Synchronize())
	}
	require.NoError(t, recvW.Close())
	require.ErrorIs(t, send.Wait(ctx), ucp.ErrPeerFailed)
	for range 3 {
		require.NoError(t, x.Launch(cs))
	}
	done := make(chan error, 1)
	go func() { done <- s.Synchronize() }()
	select {
	case <-done: // the stream's error, if any, is the failed puts'
	case <-time.After(30 * time.Second):
		t.Fatal("launches after the receiver died still wait on it")
	}
	require.NoError(t, send.Free())
}

// Device buffers made ready from the host (Pready, in reverse) and in stream order
// (PreadyOnStream after a fill kernel), received with ArrivedOnStream: every partition
// is staged through the requests' host copies, the receive buffer is checksummed on
// the device each iteration.
func TestGPUPreparedDeviceBuffersHostAndStream(t *testing.T) {
	g := requireGPU(t)
	recvW, sendW, toRecv, toSend := shmWorkers(t)
	const parts, partBytes = 16, 64 << 10
	const n = parts * partBytes
	out, err := g.ctx.MemAlloc(n)
	require.NoError(t, err)
	t.Cleanup(func() { _ = out.Close() })
	in, err := g.ctx.MemAlloc(n)
	require.NoError(t, err)
	t.Cleanup(func() { _ = in.Close() })
	send, recv := preparedPairOf(t, g, sendW, recvW, toRecv, toSend, ucp.DeviceBuffer(out.Ptr(), n), ucp.DeviceBuffer(in.Ptr(), n), parts, parts, 0x62, ucp.MemoryCUDA)
	ss, rs := g.stream(t), g.stream(t)
	scs, _ := stream.CUDAStream(ss)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for it := 1; it <= 50; it++ {
		seed := uint32(it * 104729)
		require.NoError(t, recv.Start())
		require.NoError(t, send.Start())
		require.NoError(t, scs.LaunchKernel(g.fill, cuda.Linear(64, 256), out.Ptr(), uint64(n), seed))
		if it%2 == 1 {
			require.NoError(t, ss.Synchronize())
			for p := parts - 1; p >= 0; p-- {
				require.NoError(t, send.Pready(p))
			}
		} else {
			for p := range parts {
				require.NoError(t, send.PreadyOnStream(ss, p))
			}
		}
		require.NoError(t, recv.WaitOnStream(rs))
		sum := g.deviceSum(t, rs, in.Ptr(), n)
		sendDone := make(chan error, 1)
		go func() { sendDone <- send.Wait(ctx) }()
		require.NoError(t, recv.Wait(ctx), "iteration %d: receive", it)
		require.NoError(t, <-sendDone, "iteration %d: send", it)
		require.NoError(t, rs.Synchronize())
		require.Equal(t, fillSum(n, seed), sum(), "iteration %d: device checksum of the receive buffer", it)
		require.NoError(t, ss.Synchronize())
	}
	require.Equal(t, uint64(50*parts), send.Stats().Puts)
	require.Equal(t, uint64(1), recv.Stats().TagMatches)
}

// dumpPartitionWords logs the words of a stuck iteration, read through a stream of
// its own: the sender's ready flags, the words its trigger table points at (a staged
// request's ready words), the receiver's handle words.
func dumpPartitionWords(t *testing.T, g *gpu, sh, rh prepare.DeviceHandle) {
	s := g.stream(t)
	cs, _ := stream.CUDAStream(s)
	read := func(addr uintptr, n int) []uint64 {
		buf := g.mapped(t, 8*n)
		if err := cs.MemcpyDtoH(uintptr(unsafe.Pointer(&buf.Bytes()[0])), addr, 8*n); err != nil {
			t.Logf("read %#x: %v", addr, err)
			return nil
		}
		if err := s.Synchronize(); err != nil {
			t.Logf("read %#x: %v", addr, err)
			return nil
		}
		out := make([]uint64, n)
		for i := range out {
			out[i] = binary.LittleEndian.Uint64(buf.Bytes()[8*i:])
		}
		return out
	}
	t.Logf("iteration %d: sender flags %v", sh.Iteration, read(sh.Words, sh.Partitions))
	if sh.Triggers != 0 {
		table := read(sh.Triggers, sh.Partitions)
		var triggers []uint64
		for _, a := range table {
			if w := read(uintptr(a), 1); len(w) == 1 {
				triggers = append(triggers, w[0])
			}
		}
		t.Logf("trigger value %d, triggers %v", sh.TriggerValue, triggers)
	}
	t.Logf("receiver words %v", read(rh.Words, rh.Partitions))
}
