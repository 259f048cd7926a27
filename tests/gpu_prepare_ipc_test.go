package tests

import (
	"context"
	"encoding/binary"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/cgo/cuda"
	"github.com/ucpx/ucpx/condition"
	"github.com/ucpx/ucpx/device"
	"github.com/ucpx/ucpx/graph"
	"github.com/ucpx/ucpx/prepare"
	"github.com/ucpx/ucpx/stream"
	"github.com/ucpx/ucpx/ucp"
)

// Prepared partitions between two processes on one host, device buffers on both
// sides (ContextParams.Device): the direct path, nothing staged. The parent sends,
// the child ("prepare" scenario) receives with a consumer kernel per iteration
// (ucpx_parrived_wait_block, then a checksum of each receive partition) and reports
// the sum over all iterations. The sender runs four phases of iterations: Pready
// from the host, PreadyOnStream after a fill kernel, a producer kernel calling
// ucpx_pready, and a CUDA graph of PreadyNode nodes relaunched with no host call.

const (
	tagPrepIPC     = 0x1bc
	prepIPCRecvPts = 8
	prepIPCPhase   = 50 // iterations of each of the sender's four phases
)

func us(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }

// preparedReceiver is the child's side.
func (x *ipcSide) preparedReceiver(ctx context.Context, iters, n int) (uint64, error) {
	rbuf, err := x.cctx.MemAlloc(n)
	if err != nil {
		return 0, err
	}
	defer rbuf.Close()
	recv, err := prepare.PrecvInit(x.w, ucp.DeviceBuffer(rbuf.Ptr(), n), prepare.Params{
		Peer: x.ep, Tag: tagPrepIPC, Partitions: prepIPCRecvPts, Backend: x.b, MemoryType: ucp.MemoryCUDA})
	if err != nil {
		return 0, err
	}
	defer recv.Free()
	if err := prepare.PrepareAll(ctx, recv); err != nil {
		return 0, err
	}
	parrived, unload, err := testKernel(x.cctx, device.KernelParrived)
	if err != nil {
		return 0, err
	}
	defer unload()
	sums, err := x.cctx.MemHostAlloc(8*prepIPCRecvPts, cuda.HostAllocPortable|cuda.HostAllocDeviceMap)
	if err != nil {
		return 0, err
	}
	defer sums.Close()
	status, err := x.cctx.MemHostAlloc(16*prepIPCRecvPts, cuda.HostAllocPortable|cuda.HostAllocDeviceMap)
	if err != nil {
		return 0, err
	}
	defer status.Close()
	s, err := x.b.NewStream()
	if err != nil {
		return 0, err
	}
	defer s.Close()
	cs, _ := stream.CUDAStream(s)
	var total uint64
	// Where each phase's time goes on this side (printed; the parent logs it).
	var inStart, inLand, inWait, inSync time.Duration
	for it := 1; it <= iters; it++ {
		clear(sums.Bytes())
		clear(status.Bytes())
		t0 := time.Now()
		if err := recv.Start(); err != nil {
			return 0, err
		}
		inStart += time.Since(t0)
		rh, err := recv.DeviceHandle()
		if err != nil {
			return 0, err
		}
		if err := cs.LaunchKernel(parrived, cuda.Linear(prepIPCRecvPts, 256), rh.Kernel(), rbuf.Ptr(), sums.DevicePtr(), status.DevicePtr()); err != nil {
			return 0, err
		}
		tl := time.Now()
		for q := 0; q < prepIPCRecvPts; { // every partition in place, as the host sees it
			ok, err := recv.Parrived(q)
			if err != nil {
				return 0, err
			}
			if ok {
				q++
			}
		}
		t1 := time.Now()
		inLand += t1.Sub(tl)
		if err := recv.Wait(ctx); err != nil {
			return 0, fmt.Errorf("iteration %d: %w", it, err)
		}
		t2 := time.Now()
		inWait += t2.Sub(t1)
		if err := s.Synchronize(); err != nil {
			return 0, err
		}
		inSync += time.Since(t2)
		if it%prepIPCPhase == 0 {
			fmt.Printf("receiver, iterations %d-%d: Start %.1f us, all arrived %.1f us later, Wait %.1f us, Synchronize %.1f us per iteration\n",
				it-prepIPCPhase+1, it, us(inStart)/prepIPCPhase, us(inLand)/prepIPCPhase, us(inWait)/prepIPCPhase, us(inSync)/prepIPCPhase)
			inStart, inLand, inWait, inSync = 0, 0, 0, 0
		}
		for q := range prepIPCRecvPts {
			if st := binary.LittleEndian.Uint64(status.Bytes()[16*q+8:]); st != 1 {
				return 0, fmt.Errorf("iteration %d partition %d: consumer status %d", it, q, st)
			}
			total += binary.LittleEndian.Uint64(sums.Bytes()[8*q:])
		}
	}
	if st := x.w.StagingStats(); st.Bytes != 0 {
		return 0, fmt.Errorf("the receiver staged %d bytes", st.Bytes)
	}
	return total, nil
}

func TestGPUPreparedIPC(t *testing.T) {
	g := requireGPU(t)
	const sparts, n, phase = 16, 4 << 20, prepIPCPhase
	const iters = 4 * phase
	x, out, done := startIPCPeer(t, g, "prepare", iters, n)
	sbuf, err := g.ctx.MemAlloc(n)
	require.NoError(t, err)
	defer sbuf.Close()
	send, err := prepare.PsendInit(x.w, ucp.DeviceBuffer(sbuf.Ptr(), n), prepare.Params{
		Peer: x.ep, Tag: tagPrepIPC, Partitions: sparts, Backend: g.backend, MemoryType: ucp.MemoryCUDA})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	require.NoError(t, prepare.PrepareAll(ctx, send), "child output:\n%s", out)
	s := g.stream(t)
	cs, _ := stream.CUDAStream(s)
	pready := g.kernel(t, device.KernelPready)
	failures := g.mapped(t, 8)
	phases := []struct {
		name string
		run  func(it int) error
	}{
		{"Pready", func(it int) error {
			if err := send.Start(); err != nil {
				return err
			}
			if err := cs.LaunchKernel(g.fill, cuda.Linear(256, 256), sbuf.Ptr(), uint64(n), uint32(it)); err != nil {
				return err
			}
			if err := s.Synchronize(); err != nil {
				return err
			}
			if err := send.PreadyRange(0, sparts-1); err != nil {
				return err
			}
			return send.Wait(ctx)
		}},
		{"PreadyOnStream", func(it int) error {
			if err := send.Start(); err != nil {
				return err
			}
			if err := cs.LaunchKernel(g.fill, cuda.Linear(256, 256), sbuf.Ptr(), uint64(n), uint32(it)); err != nil {
				return err
			}
			for p := sparts - 1; p >= 0; p-- {
				if err := send.PreadyOnStream(s, p); err != nil {
					return err
				}
			}
			return send.Wait(ctx)
		}},
		{"ucpx_pready", func(it int) error {
			if err := send.Start(); err != nil {
				return err
			}
			sh, err := send.DeviceHandle()
			if err != nil {
				return err
			}
			if err := cs.LaunchKernel(pready, cuda.Linear(sparts, 256), sh.Kernel(), sbuf.Ptr(), uint32(it), uint32(it%2), failures.DevicePtr()); err != nil {
				return err
			}
			return send.Wait(ctx)
		}},
	}
	it := 0
	for _, ph := range phases {
		t0 := time.Now()
		for range phase {
			it++
			require.NoError(t, ph.run(it), "%s, iteration %d; child output:\n%s", ph.name, it, out)
		}
		el := time.Since(t0)
		t.Logf("%s: %d iterations of %d x %d bytes: %.1f us per iteration, %.2f GB/s", ph.name, phase, sparts, n/sparts,
			float64(el.Microseconds())/phase, float64(n)*phase/el.Seconds()/1e9)
	}
	require.Zero(t, binary.LittleEndian.Uint64(failures.Bytes()), "ucpx_pready reported failures")

	// The graph: the launch count is the seed, a fill node, then each partition's
	// direct nodes.
	seed := g.mapped(t, 8)
	binary.LittleEndian.PutUint64(seed.Bytes(), uint64(it))
	gr, err := g.ctx.NewGraph()
	require.NoError(t, err)
	defer gr.Close()
	tick, err := g.module.Function(device.KernelTick)
	require.NoError(t, err)
	fillAt, err := g.module.Function(device.KernelFillAt)
	require.NoError(t, err)
	tk, err := gr.AddKernelNode(nil, tick, cuda.Linear(1, 1), seed.DevicePtr())
	require.NoError(t, err)
	fl, err := gr.AddKernelNode([]cuda.Node{tk}, fillAt, cuda.Linear(256, 256), sbuf.Ptr(), uint64(n), uint64(0), seed.DevicePtr())
	require.NoError(t, err)
	puts := send.Stats().Puts
	// Timing events: after the fill, after every partition's nodes (the last launch's
	// split of GPU time between its fill and the partitions' gates and copies).
	var stamps [3]*cuda.Event
	for i := range stamps {
		stamps[i], err = g.ctx.NewEvent(cuda.EventDefault)
		require.NoError(t, err)
		defer stamps[i].Close()
	}
	_, err = gr.AddEventRecordNode([]cuda.Node{tk}, stamps[0])
	require.NoError(t, err)
	_, err = gr.AddEventRecordNode([]cuda.Node{fl}, stamps[1])
	require.NoError(t, err)
	var tails []cuda.Node
	for p := range sparts {
		tail, err := send.PreadyNode(graph.CUDA{Graph: gr}, []condition.Node{fl}, p)
		require.NoError(t, err)
		nodes, err := graph.CUDANodes(tail)
		require.NoError(t, err)
		tails = append(tails, nodes...)
	}
	_, err = gr.AddEventRecordNode(tails, stamps[2])
	require.NoError(t, err)
	gx, err := gr.Instantiate(0)
	require.NoError(t, err)
	defer gx.Close()
	raw, err := g.ctx.NewStream(cuda.StreamNonBlocking, 0)
	require.NoError(t, err)
	defer raw.Close()
	stop := progressWhile(x.w) // the receiver's readiness may need this worker's progress
	t0 := time.Now()
	inLaunch, err := launchAll(gx, raw, phase)
	el := time.Since(t0)
	stop()
	require.NoError(t, err, "child output:\n%s", out)
	t.Logf("PreadyNode graph: %d launches: %.1f us per launch (cuGraphLaunch %.1f us CPU), %.2f GB/s; no ucpx call per launch",
		phase, float64(el.Microseconds())/phase, float64(inLaunch.Microseconds())/phase, float64(n)*phase/el.Seconds()/1e9)
	fill, err := cuda.ElapsedTime(stamps[0], stamps[1])
	require.NoError(t, err)
	parts, err := cuda.ElapsedTime(stamps[1], stamps[2])
	require.NoError(t, err)
	t.Logf("PreadyNode graph, last launch on the GPU: fill %.1f us, then the partitions' nodes %.1f us", us(fill), us(parts))
	require.Equal(t, puts+sparts, send.Stats().Puts, "the graph's nodes were made once")

	got := x.result(t, out)
	for _, line := range strings.Split(out.String(), "\n") {
		if strings.HasPrefix(line, "receiver, ") {
			t.Log(line)
		}
	}
	var want uint64
	for i := 1; i <= iters; i++ {
		want += partSum(0, n, uint32(i))
	}
	require.Equal(t, want, got, "the receiver's checksum over %d iterations in four phases", iters)
	require.Zero(t, x.w.StagingStats().Bytes, "nothing staged on the sender")
	require.NoError(t, send.Free())
	<-done
}
