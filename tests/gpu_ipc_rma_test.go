package tests

import (
	"context"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/cgo/cuda"
	"github.com/ucpx/ucpx/condition"
	"github.com/ucpx/ucpx/device"
	"github.com/ucpx/ucpx/stream"
	"github.com/ucpx/ucpx/ucp"
)

// The same-host device path between two processes on one GPU: the child exports a
// device region (MemMapPtr with MemoryCUDA, ContextParams.Device), the parent maps it
// through UnpackRkey and moves data with put and get as copy-engine copies.

const (
	envIPCRegion = "UCPX_TEST_IPC_REGION" // the child's region size
	tagIPCSum    = 6 << 44                // parent -> child: crc32 of region[:n] (n in the payload)
)

// runIPCExporter is the child: a CUDA context, a device region published to the
// parent, then checksums on request until told to quit (or to die).
func runIPCExporter() error {
	b, err := openChildBackend()
	if err != nil {
		return err
	}
	defer b.Close()
	cctx, _, _ := stream.CUDAContext(b)
	n, err := strconv.Atoi(os.Getenv(envIPCRegion))
	if err != nil {
		return err
	}
	dm, err := cctx.MemAlloc(n)
	if err != nil {
		return err
	}
	defer dm.Close()
	uctx, err := ucp.NewContext(ucp.ContextParams{Device: b})
	if err != nil {
		return err
	}
	defer uctx.Close()
	w, err := uctx.NewWorker(ucp.WorkerParams{})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	ep, err := w.Connect(ctx, os.Getenv(envListenAddr), nil)
	if err != nil {
		return err
	}
	m, err := uctx.MemMapPtr(dm.Ptr(), n, ucp.MemoryCUDA)
	if err != nil {
		return err
	}
	packed, err := m.PackRkey()
	if err != nil {
		return err
	}
	if err := send(ctx, ep, packed, tagRkey); err != nil {
		return err
	}
	host, err := cctx.MemHostAlloc(n, cuda.HostAllocPortable)
	if err != nil {
		return err
	}
	defer host.Close()
	s, err := cctx.NewStream(cuda.StreamNonBlocking, 0)
	if err != nil {
		return err
	}
	defer s.Close()
	buf := make([]byte, 64)
	for {
		r, err := w.TagRecvNbx(buf, 0, 0, nil)
		if err != nil {
			return err
		}
		if err := r.Wait(ctx); err != nil {
			return err
		}
		switch r.SenderTag() {
		case tagQuit:
			return nil
		case tagDie:
			os.Exit(3)
		case tagIPCSum:
			k := int(binary.LittleEndian.Uint64(buf))
			if err := s.MemcpyDtoH(host.Addr(), dm.Ptr(), k); err != nil {
				return err
			}
			if err := s.Synchronize(); err != nil {
				return err
			}
			var out [4]byte
			binary.LittleEndian.PutUint32(out[:], crc32.ChecksumIEEE(host.Bytes()[:k]))
			if err := send(ctx, ep, out[:], tagIPCSum|tagReply); err != nil {
				return err
			}
		}
	}
}

// ipcExporter is the parent's view of the child.
type ipcExporter struct {
	uctx  *ucp.Context
	w     *ucp.Worker
	ep    *ucp.Endpoint
	rk    *ucp.Rkey
	out   *childOutput
	epErr chan error
	done  chan struct{}
	gpu   int // the child's device ordinal
}

func startIPCExporter(t testing.TB, g *gpu, region int) *ipcExporter {
	t.Helper()
	x := &ipcExporter{epErr: make(chan error, 1)}
	var err error
	x.uctx, err = ucp.NewContext(ucp.ContextParams{Device: g.backend})
	require.NoError(t, err)
	t.Cleanup(func() { _ = x.uctx.Close() }) // after the child is gone
	x.w, err = x.uctx.NewWorker(ucp.WorkerParams{})
	require.NoError(t, err)
	l, err := x.w.Listen("127.0.0.1:0", nil)
	require.NoError(t, err)
	var onGPU string
	x.gpu, onGPU = childGPU(t, 1)
	x.ep, x.out, x.done = spawnRole(t, l, "ipc-exporter", &ucp.EndpointParams{ErrorHandler: func(_ *ucp.Endpoint, err error) { x.epErr <- err }},
		envIPCRegion+"="+strconv.Itoa(region), onGPU)
	require.NoError(t, l.Close())
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	buf := make([]byte, 4096)
	r, err := x.w.TagRecvNbx(buf, tagRkey, ^uint64(0), nil)
	require.NoError(t, err)
	require.NoError(t, r.Wait(ctx), "child output:\n%s", x.out)
	x.rk, err = x.ep.UnpackRkey(buf[:r.Length()])
	require.NoError(t, err, "the GPU is here: a same-host device region must map")
	require.True(t, x.rk.Device())
	return x
}

// sum asks the child for crc32 of its region's first n bytes.
func (x *ipcExporter) sum(t testing.TB, n int) uint32 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var reply [4]byte
	rr, err := x.w.TagRecvNbx(reply[:], tagIPCSum|tagReply, ^uint64(0), nil)
	require.NoError(t, err)
	var req [8]byte
	binary.LittleEndian.PutUint64(req[:], uint64(n))
	require.NoError(t, send(ctx, x.ep, req[:], tagIPCSum))
	require.NoError(t, rr.Wait(ctx), "child output:\n%s", x.out)
	return binary.LittleEndian.Uint32(reply[:])
}

func (x *ipcExporter) quit(t testing.TB) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, send(ctx, x.ep, nil, tagQuit))
	select {
	case <-x.done:
	case <-ctx.Done():
		t.Fatalf("child did not exit; output:\n%s", x.out)
	}
}

// TestGPUIPCRMA: put and get between two processes on one GPU, plain and under
// Stream, non-blocking and KernelTriggered conditions, 4 B to 1 GiB, checked by
// crc32 on both sides; then the child dies with its memory mapped here.
func TestGPUIPCRMA(t *testing.T) {
	g := requireGPU(t)
	const region = 1 << 30
	x := startIPCExporter(t, g, region)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()

	const slack = 4096
	src, err := g.ctx.MemAlloc(region + slack)
	require.NoError(t, err)
	defer src.Close()
	dst, err := g.ctx.MemAlloc(region)
	require.NoError(t, err)
	defer dst.Close()
	host, err := g.ctx.MemHostAlloc(region+slack, cuda.HostAllocPortable)
	require.NoError(t, err)
	defer host.Close()
	back, err := g.ctx.MemHostAlloc(region, cuda.HostAllocPortable)
	require.NoError(t, err)
	defer back.Close()
	pat := host.Bytes()
	for i := range pat {
		pat[i] = byte(i*131 + i>>9)
	}
	s := g.stream(t)
	cs, _ := stream.CUDAStream(s)
	require.NoError(t, cs.MemcpyHtoD(src.Ptr(), host.Addr(), region+slack))
	require.NoError(t, cs.Synchronize())
	sc, err := condition.Create(condition.Param{Category: condition.Stream, Backend: g.backend, Stream: s})
	require.NoError(t, err)
	defer func() { require.NoError(t, sc.Destroy()) }()
	kc, err := condition.Create(condition.Param{Category: condition.KernelTriggered, Backend: g.backend})
	require.NoError(t, err)
	defer func() { require.NoError(t, kc.Destroy()) }()

	modes := []string{"plain", "stream", "nonblocking", "kernel-triggered"}
	sizes := []int{4, 4096, 1 << 20, 4<<20 + 5, 64 << 20, 256 << 20, region}
	for mi, mode := range modes {
		for _, n := range sizes {
			off := (mi*997 + n%7) % slack // each run moves different bytes
			if mi%2 == 1 {
				// Source and destination equal modulo 16: up to 16 MiB the backend's
				// copy kernel moves these (the copy engine the others).
				off &^= 15
			}
			var prm *ucp.RequestParam
			switch mode {
			case "stream":
				prm = &ucp.RequestParam{Condition: sc, MemoryType: ucp.MemoryCUDA}
			case "nonblocking":
				prm = &ucp.RequestParam{Condition: sc, MemoryType: ucp.MemoryCUDA, Flags: ucp.NonBlockingEnqueue}
			case "kernel-triggered":
				prm = &ucp.RequestParam{Condition: kc, MemoryType: ucp.MemoryCUDA}
			default:
				prm = &ucp.RequestParam{MemoryType: ucp.MemoryCUDA}
			}
			trigger := func() {
				if mode == "kernel-triggered" {
					h, err := kc.DeviceHandle()
					require.NoError(t, err)
					require.NoError(t, condition.Trigger(h))
				}
			}
			put, err := x.ep.PutNbx(ucp.DeviceBuffer(src.Ptr()+uintptr(off), n), x.rk.Base(), x.rk, prm)
			require.NoError(t, err, "%s put %d", mode, n)
			trigger()
			require.NoError(t, put.Wait(ctx), "%s put %d", mode, n)
			want := crc32.ChecksumIEEE(pat[off : off+n])
			require.Equal(t, want, x.sum(t, n), "%s put of %d bytes: the peer's device memory", mode, n)

			require.NoError(t, cs.MemsetD8(dst.Ptr(), 0, n))
			require.NoError(t, cs.Synchronize())
			get, err := x.ep.GetNbx(ucp.DeviceBuffer(dst.Ptr(), n), x.rk.Base(), x.rk, prm)
			require.NoError(t, err, "%s get %d", mode, n)
			trigger()
			require.NoError(t, get.Wait(ctx), "%s get %d", mode, n)
			require.NoError(t, cs.MemcpyDtoH(back.Addr(), dst.Ptr(), n))
			require.NoError(t, cs.Synchronize())
			require.Equal(t, want, crc32.ChecksumIEEE(back.Bytes()[:n]), "%s get of %d bytes", mode, n)
		}
	}
	require.Zero(t, x.w.StagingStats().Bytes, "the IPC path stages nothing")

	// The child dies with its memory mapped here: the endpoint fails, later operations
	// fail at the call, and nothing hangs.
	ctx2, cancel2 := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel2()
	require.NoError(t, send(ctx2, x.ep, nil, tagDie))
	<-x.done
	stop := make(chan struct{})
	go func() {
		for {
			select {
			case <-stop:
				return
			default:
				x.w.Progress()
				time.Sleep(100 * time.Microsecond)
			}
		}
	}()
	select {
	case err := <-x.epErr:
		require.ErrorIs(t, err, ucp.ErrPeerFailed)
	case <-ctx2.Done():
		t.Fatal("the child's death was not noticed")
	}
	close(stop)
	_, err = x.ep.PutNbx(ucp.DeviceBuffer(src.Ptr(), 4096), x.rk.Base(), x.rk, &ucp.RequestParam{MemoryType: ucp.MemoryCUDA})
	require.ErrorIs(t, err, ucp.ErrPeerFailed)
}

// BenchmarkGPUIPCPut compares an IPC put of 4 MiB to 1 GiB between two processes on
// one GPU (Stream condition: the copy on the user's stream) with a same-process
// device-to-device copy of the same size on the same stream, measured in the same run:
// ratio = local copy time / IPC put time with the reference, cuMemcpyAsync
// (the target is >= 0.95), ratio_vs_dtod the same against cuMemcpyDtoDAsync, which
// skips cuMemcpyAsync's look-up of both addresses and costs the CPU less. The ways are
// timed in turn, three passes each, best pass kept, so that drift of the machine
// touches all alike. With the child on GPU 1 (UCPX_TEST_IPC_TWO_GPUS=1) the reference
// is also a same-process cuMemcpyPeerAsync from GPU 0 to GPU 1 with peer access on
// (peer_GB/s, ratio_vs_peer).
func BenchmarkGPUIPCPut(b *testing.B) {
	g := requireGPU(b)
	const region = 1 << 30
	x := startIPCExporter(b, g, region)
	src, err := g.ctx.MemAlloc(region)
	require.NoError(b, err)
	defer src.Close()
	local, err := g.ctx.MemAlloc(region)
	require.NoError(b, err)
	defer local.Close()
	s := g.stream(b)
	cs, _ := stream.CUDAStream(s)
	sc, err := condition.Create(condition.Param{Category: condition.Stream, Backend: g.backend, Stream: s})
	require.NoError(b, err)
	defer func() { require.NoError(b, sc.Destroy()) }()
	ctx := context.Background()
	var peerCtx *cuda.Context
	var peerDst *cuda.DeviceMemory
	if x.gpu != 0 {
		dev, err := cuda.GetDevice(x.gpu)
		require.NoError(b, err)
		peerCtx, err = dev.RetainPrimaryContext()
		require.NoError(b, err)
		defer peerCtx.Close()
		if err := g.ctx.EnablePeerAccess(peerCtx); err != nil {
			require.ErrorIs(b, err, cuda.ErrPeerAccessAlreadyOn)
		}
		peerDst, err = peerCtx.MemAlloc(region)
		require.NoError(b, err)
		defer peerDst.Close()
	}
	for _, n := range []int{4 << 20, 64 << 20, 256 << 20, 1 << 30} {
		b.Run(fmt.Sprintf("%dMiB", n>>20), func(b *testing.B) {
			reps := max(4, (2<<30)/n)
			var last *ucp.Request
			prm := &ucp.RequestParam{Condition: sc, MemoryType: ucp.MemoryCUDA}
			// The same copy into the mapping with no ucpx: what the driver charges.
			mapped, err := x.rk.DeviceAddress(x.rk.Base(), n)
			require.NoError(b, err)
			type way struct {
				name string
				f    func() error
				best time.Duration
				cpu  time.Duration // in f, over all calls
				nf   int
			}
			ways := []*way{
				{name: "ipc", f: func() error {
					r, err := x.ep.PutNbx(ucp.DeviceBuffer(src.Ptr(), n), x.rk.Base(), x.rk, prm)
					last = r
					return err
				}},
				{name: "local", f: func() error { return cs.Memcpy(local.Ptr(), src.Ptr(), n) }},
				{name: "dtod", f: func() error { return cs.MemcpyDtoD(local.Ptr(), src.Ptr(), n) }},
				{name: "raw", f: func() error { return cs.MemcpyDtoD(mapped, src.Ptr(), n) }},
			}
			if peerDst != nil {
				ways = append(ways, &way{name: "peer", f: func() error { return cs.MemcpyPeer(peerDst.Ptr(), peerCtx, src.Ptr(), g.ctx, n) }})
			}
			for _, w := range ways {
				require.NoError(b, w.f()) // warm
				w.best = time.Duration(1 << 62)
			}
			require.NoError(b, cs.Synchronize())
			for range 3 {
				for _, w := range ways {
					t0 := time.Now()
					for range reps {
						t1 := time.Now()
						err := w.f()
						w.cpu += time.Since(t1)
						w.nf++
						require.NoError(b, err)
					}
					require.NoError(b, cs.Synchronize())
					w.best = min(w.best, time.Since(t0)/time.Duration(reps))
				}
			}
			require.NoError(b, last.Wait(ctx))
			ipc, loc, dtod, raw := ways[0], ways[1], ways[2], ways[3]
			gbs := func(w *way) float64 { return float64(n) / w.best.Seconds() / 1e9 }
			cpu := func(w *way) float64 { return float64(w.cpu.Nanoseconds()) / 1e3 / float64(w.nf) }
			if peerDst != nil {
				peer := ways[4]
				b.ReportMetric(gbs(peer), "peer_GB/s")
				b.ReportMetric(peer.best.Seconds()/ipc.best.Seconds(), "ratio_vs_peer")
			}
			b.ReportMetric(gbs(ipc), "ipc_GB/s")
			b.ReportMetric(gbs(raw), "raw_ipc_GB/s")
			b.ReportMetric(gbs(loc), "local_GB/s")
			b.ReportMetric(gbs(dtod), "local_dtod_GB/s")
			b.ReportMetric(loc.best.Seconds()/ipc.best.Seconds(), "ratio")
			b.ReportMetric(dtod.best.Seconds()/ipc.best.Seconds(), "ratio_vs_dtod")
			b.ReportMetric(raw.best.Seconds()/ipc.best.Seconds(), "ratio_vs_raw")
			b.ReportMetric(cpu(ipc), "cpu_us_per_put")
			b.ReportMetric(cpu(loc), "cpu_us_per_local_copy")
			b.ReportMetric(cpu(raw), "cpu_us_per_raw_copy")
			b.ReportMetric(0, "ns/op")
		})
	}
	x.quit(b)
}

// BenchmarkGPUIPCGraphLaunch64: the CPU cost of relaunching a CUDA graph of 64 IPC
// copies (memcpy nodes into the peer's mapped region, Rkey.DeviceAddress) against the
// same graph of 64 local device-to-device copies, same run: ratio = IPC / local (the
// target is the cost of cuGraphLaunch alone: no proxy work, ratio about 1).
func BenchmarkGPUIPCGraphLaunch64(b *testing.B) {
	g := requireGPU(b)
	const nodes, size, launches = 64, 4096, 2000
	x := startIPCExporter(b, g, nodes*size)
	src, err := g.ctx.MemAlloc(nodes * size)
	require.NoError(b, err)
	defer src.Close()
	local, err := g.ctx.MemAlloc(nodes * size)
	require.NoError(b, err)
	defer local.Close()
	remote, err := x.rk.DeviceAddress(x.rk.Base(), nodes*size)
	require.NoError(b, err)
	s, err := g.ctx.NewStream(cuda.StreamNonBlocking, 0)
	require.NoError(b, err)
	defer s.Close()
	cpuPerLaunch := func(dst uintptr) time.Duration {
		gr, err := g.ctx.NewGraph()
		require.NoError(b, err)
		defer gr.Close()
		for i := range nodes {
			_, err := gr.AddMemcpyNode(nil, dst+uintptr(i*size), src.Ptr()+uintptr(i*size), size)
			require.NoError(b, err)
		}
		gx, err := gr.Instantiate(0)
		require.NoError(b, err)
		defer gx.Close()
		var spent time.Duration
		for i := range launches {
			t0 := time.Now()
			require.NoError(b, gx.Launch(s))
			spent += time.Since(t0)
			if i%32 == 31 {
				require.NoError(b, s.Synchronize())
			}
		}
		require.NoError(b, s.Synchronize())
		return spent / launches
	}
	cpuPerLaunch(local.Ptr()) // warm
	loc := cpuPerLaunch(local.Ptr())
	ipc := cpuPerLaunch(remote)
	b.ReportMetric(float64(ipc.Nanoseconds())/1e3, "ipc_launch_us")
	b.ReportMetric(float64(loc.Nanoseconds())/1e3, "local_launch_us")
	b.ReportMetric(float64(ipc)/float64(loc), "ratio")
	b.ReportMetric(0, "ns/op")
	x.quit(b)
}

// BenchmarkGPUIPCPutCPU is the CPU cost of one Stream-condition IPC put of 8 bytes
// (the GPU's part is negligible), for profiling the issue path (-test.cpuprofile),
// beside the driver calls it is made of, on the same stream into the same mapping:
// put (PutNbx), copy (cuMemcpyDtoDAsync), uncaptured (the capture check and the copy
// in one C call), local (the copy into memory of this process), kernel (the capture
// check and the copy kernel's launch in one C call, what the put issues).
func BenchmarkGPUIPCPutCPU(b *testing.B) {
	g := requireGPU(b)
	x := startIPCExporter(b, g, 1<<20)
	defer x.quit(b)
	src, err := g.ctx.MemAlloc(8)
	require.NoError(b, err)
	defer src.Close()
	local, err := g.ctx.MemAlloc(8)
	require.NoError(b, err)
	defer local.Close()
	s := g.stream(b)
	cs, _ := stream.CUDAStream(s)
	sc, err := condition.Create(condition.Param{Category: condition.Stream, Backend: g.backend, Stream: s})
	require.NoError(b, err)
	defer func() { require.NoError(b, sc.Destroy()) }()
	prm := &ucp.RequestParam{Condition: sc, MemoryType: ucp.MemoryCUDA}
	buf := ucp.DeviceBuffer(src.Ptr(), 8)
	mapped, err := x.rk.DeviceAddress(x.rk.Base(), 8)
	require.NoError(b, err)
	sig, err := g.ctx.LoadModule(device.SignalKernelsPTX())
	require.NoError(b, err)
	defer sig.Close()
	copyKernel, err := sig.Function(device.KernelCopy)
	require.NoError(b, err)
	for _, c := range []struct {
		name string
		f    func() error
	}{
		{"put", func() error {
			_, err := x.ep.PutNbx(buf, x.rk.Base(), x.rk, prm)
			return err
		}},
		{"copy", func() error { return cs.MemcpyDtoD(mapped, src.Ptr(), 8) }},
		{"uncaptured", func() error {
			_, err := cs.MemcpyDtoDUncaptured(mapped, src.Ptr(), 8)
			return err
		}},
		{"local", func() error { return cs.MemcpyDtoD(local.Ptr(), src.Ptr(), 8) }},
		{"kernel", func() error {
			_, err := cs.LaunchCopyUncaptured(copyKernel, 1, 512, mapped, src.Ptr(), 8)
			return err
		}},
	} {
		b.Run(c.name, func(b *testing.B) {
			f := c.f
			for i := range b.N {
				if err := f(); err != nil {
					b.Fatal(err)
				}
				if i%1024 == 1023 {
					require.NoError(b, cs.Synchronize())
					x.w.Progress()
				}
			}
			require.NoError(b, cs.Synchronize())
			x.w.Progress()
		})
	}
}

// BenchmarkGPUIPCGraphCopy: how the same copy of 4 MiB into a peer process's mapped
// buffer costs on the GPU as a stream copy, as one memcpy node of a graph, as 16
// memcpy nodes of 256 KiB, and as a captured stream copy (µs per copy or launch,
// 20 back to back). Under UCPX_TEST_IPC_TWO_GPUS=1 the buffer is on the other GPU.
func BenchmarkGPUIPCGraphCopy(b *testing.B) {
	g := requireGPU(b)
	const n, parts, reps = 4 << 20, 16, 20
	x := startIPCExporter(b, g, n)
	src, err := g.ctx.MemAlloc(n)
	require.NoError(b, err)
	defer src.Close()
	dst, err := x.rk.DeviceAddress(x.rk.Base(), n)
	require.NoError(b, err)
	s, err := g.ctx.NewStream(cuda.StreamNonBlocking, 0)
	require.NoError(b, err)
	defer s.Close()
	per := func(f func() error) float64 {
		require.NoError(b, f())
		require.NoError(b, s.Synchronize())
		t0 := time.Now()
		for range reps {
			require.NoError(b, f())
		}
		require.NoError(b, s.Synchronize())
		return float64(time.Since(t0).Nanoseconds()) / 1e3 / reps
	}
	launcher := func(gr *cuda.Graph) func() error {
		gx, err := gr.Instantiate(0)
		require.NoError(b, err)
		b.Cleanup(func() { _ = gx.Close(); _ = gr.Close() })
		return func() error { return gx.Launch(s) }
	}
	one, err := g.ctx.NewGraph()
	require.NoError(b, err)
	_, err = one.AddMemcpyNode(nil, dst, src.Ptr(), n)
	require.NoError(b, err)
	many, err := g.ctx.NewGraph()
	require.NoError(b, err)
	for i := range parts {
		off := uintptr(i * n / parts)
		_, err = many.AddMemcpyNode(nil, dst+off, src.Ptr()+off, n/parts)
		require.NoError(b, err)
	}
	require.NoError(b, s.BeginCapture(cuda.CaptureThreadLocal))
	require.NoError(b, s.MemcpyDtoD(dst, src.Ptr(), n))
	captured, err := s.EndCapture()
	require.NoError(b, err)
	b.ReportMetric(per(func() error { return s.MemcpyDtoD(dst, src.Ptr(), n) }), "stream_us")
	b.ReportMetric(per(launcher(one)), "graph_1node_us")
	b.ReportMetric(per(launcher(many)), "graph_16nodes_us")
	b.ReportMetric(per(launcher(captured)), "graph_captured_us")
	b.ReportMetric(0, "ns/op")
	x.quit(b)
}
