package tests

import (
	"context"
	"encoding/binary"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/cgo/cuda"
	"github.com/ucpx/ucpx/device"
	"github.com/ucpx/ucpx/prepare"
	"github.com/ucpx/ucpx/stream"
	"github.com/ucpx/ucpx/ucp"
)

// BenchmarkGPUPreparedHalfRoundTrip: a prepared partition ping-pong between kernels of
// two workers (shared memory) against its floor, all measured in this one run:
//
//	kflag-us     kernel flag round trip: a kernel stores a word, a host goroutine
//	             echoes it, the kernel sees the echo (ucpx_test_echo, %globaltimer)
//	put-us       UCX put latency: half the round trip of a host put-with-signal
//	             ping-pong between the two workers (8 B) into memory UCX allocated
//	             (shared memory UCX reaches without a system call)
//	put-mapped-us  the same as the prepared path moves it: into host-mapped pinned
//	             buffers and CUDA-backend signal words (UCX reaches them with cma, a
//	             system call per put), the signal stored with a put (SignalStore)
//	half-rt-us   prepared: worker A's kernel fills a partition and calls ucpx_pready,
//	             B's kernel (running, waiting in ucpx_parrived_wait) sees it, fills
//	             and readies the partition back, A's kernel sees it: half of A's
//	             %globaltimer stamps right before ucpx_pready and right after
//	             ucpx_parrived_wait (ucpx_test_part_pingpong; one kernel per side and
//	             iteration, launched after each iteration's Starts: B's first)
//	a-to-b-us, b-to-a-us  each direction alone (B's stamps after ucpx_parrived_wait
//	             and before ucpx_pready; one GPU, one timer)
//	launch-half-rt-us  the same between CUDA events recorded around A's kernel, so
//	             with A's launch and exit inside
//	ratio        half-rt-us / (kflag-us + put-mapped-us): the same transfers; target <= 1.3
//	ratio-alloc  half-rt-us / (kflag-us + put-us)
//
// Each of the n iterations checks the partition's checksum on both sides.
//
// Two ways to progress the workers: spin (a goroutine per worker polling it without
// yielding, as ucx_perftest's processes do) and thread (ucp.WorkerParams.ProgressThread,
// the library's own, which parks on the event fd when idle); spin-sync is spin with
// the host waiting for the GPU before it waits for the requests.
func BenchmarkGPUPreparedHalfRoundTrip(b *testing.B) {
	for _, mode := range []string{"spin", "thread", "spin-sync", "direct"} {
		b.Run(mode, func(b *testing.B) { preparedHalfRoundTrip(b, mode == "thread", mode == "spin-sync", mode == "direct") })
	}
}

// syncFirst: the host waits for both streams before it waits for the requests, so
// that no Wait loop progresses the workers while the kernels run.
//
// direct: the context has ContextParams.Device and the buffers are device memory, so
// the partitions take the direct path: ucpx_pready copies into the peer's buffer and
// stores its counter itself (the two workers are in one process: the allocation is
// its own mapping), with no engine and no UCX on the path (spin progress).
func preparedHalfRoundTrip(b *testing.B, progressThread, syncFirst, direct bool) {
	g := requireGPU(b)
	n := max(b.N, 200)
	const partBytes = 64

	// The kernel flag round trip.
	words, err := g.backend.AllocWords(2)
	require.NoError(b, err)
	defer words.Close()
	trig, done := words.Word(0), words.Word(1)
	stopEcho := echoFlag(trig, done)
	s := g.stream(b)
	cs, _ := stream.CUDAStream(s)
	res := g.mapped(b, 16)
	require.NoError(b, cs.LaunchKernel(g.echo, cuda.Linear(1, 1), trig.DevicePtr(), done.DevicePtr(), uint64(0), uint64(n), res.DevicePtr()))
	require.NoError(b, s.Synchronize())
	stopEcho()
	require.EqualValues(b, n, binary.LittleEndian.Uint64(res.Bytes()))
	kflag := float64(binary.LittleEndian.Uint64(res.Bytes()[8:])) / float64(n) / 1e3

	// Two workers of one context over shared memory.
	cp := ucp.ContextParams{}
	if direct {
		cp.Device = g.backend
	}
	wa, wb, toB, toA := contextWorkers(b, cp, ucp.WorkerParams{ProgressThread: progressThread})

	// The UCX put latency: an 8-byte put-with-signal ping-pong.
	put := putPingPong(b, wa, wb, toA, toB, n, nil)
	putMapped := putPingPong(b, wa, wb, toA, toB, n, g)

	// The prepared ping-pong: A -> B on req 1, B -> A on req 2, one partition each.
	type partBuf struct {
		buf []byte
		ptr uintptr
	}
	newBuf := func() partBuf {
		if direct {
			d, err := g.ctx.MemAlloc(partBytes)
			require.NoError(b, err)
			b.Cleanup(func() { _ = d.Close() })
			return partBuf{ucp.DeviceBuffer(d.Ptr(), partBytes), d.Ptr()}
		}
		m := g.mapped(b, partBytes)
		return partBuf{m.Bytes(), m.DevicePtr()}
	}
	outA, inA, outB, inB := newBuf(), newBuf(), newBuf(), newBuf()
	mt := ucp.MemoryHost
	if direct {
		mt = ucp.MemoryCUDA
	}
	mk := func(init func(*ucp.Worker, []byte, prepare.Params) (*prepare.Request, error), w *ucp.Worker, buf partBuf, peer *ucp.Endpoint, tag uint64) *prepare.Request {
		r, err := init(w, buf.buf, prepare.Params{Peer: peer, Tag: tag, Partitions: 1, Backend: g.backend, MemoryType: mt})
		require.NoError(b, err)
		return r
	}
	send1, recv1 := mk(prepare.PsendInit, wa, outA, toB, 1), mk(prepare.PrecvInit, wb, inB, toA, 1)
	send2, recv2 := mk(prepare.PsendInit, wb, outB, toA, 2), mk(prepare.PrecvInit, wa, inA, toB, 2)
	reqs := []*prepare.Request{send1, recv1, send2, recv2}
	defer func() {
		for _, r := range reqs {
			_ = r.Free()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	require.NoError(b, prepare.PrepareAll(ctx, reqs...))
	pingpong := g.kernel(b, device.KernelPartPingPong)
	sa, sb := g.stream(b), g.stream(b)
	csa, _ := stream.CUDAStream(sa)
	csb, _ := stream.CUDAStream(sb)
	evStart, err := g.ctx.NewEvent(cuda.EventDefault)
	require.NoError(b, err)
	defer evStart.Close()
	evEnd, err := g.ctx.NewEvent(cuda.EventDefault)
	require.NoError(b, err)
	defer evEnd.Close()
	sumsA, sumsB, stamps := g.mapped(b, 8), g.mapped(b, 8), g.mapped(b, 32)
	failures := g.mapped(b, 8)
	clear(failures.Bytes())
	// Each worker has a goroutine polling it without yielding, as ucx_perftest's
	// processes do (the GPU machine has cores to spare).
	if !progressThread {
		stopA, stopB := spinProgress(wa), spinProgress(wb)
		defer stopA()
		defer stopB()
	}
	handle := func(r *prepare.Request) device.PartitionHandle {
		h, err := r.DeviceHandle()
		require.NoError(b, err)
		return h.Kernel()
	}

	var kernelNs, abNs, baNs uint64
	var launched time.Duration
	b.ResetTimer()
	for it := 1; it <= n; it++ {
		seedA, seedB := uint32(it*31), uint32(it*37+1)
		require.NoError(b, recv1.Start())
		require.NoError(b, send2.Start())
		require.NoError(b, recv2.Start())
		require.NoError(b, send1.Start())
		rh1, sh2, rh2, sh1 := handle(recv1), handle(send2), handle(recv2), handle(send1)
		require.Equal(b, direct, sh1.PeerBuf != 0 && sh2.PeerBuf != 0, "direct path taken iff the context has a Device")
		require.NoError(b, csb.LaunchKernel(pingpong, cuda.Linear(1, 128), sh2, rh1, outB.ptr, inB.ptr, seedB, uint32(0), sumsB.DevicePtr(), stamps.DevicePtr(), failures.DevicePtr()))
		require.NoError(b, evStart.Record(csa))
		require.NoError(b, csa.LaunchKernel(pingpong, cuda.Linear(1, 128), sh1, rh2, outA.ptr, inA.ptr, seedA, uint32(1), sumsA.DevicePtr(), stamps.DevicePtr(), failures.DevicePtr()))
		require.NoError(b, evEnd.Record(csa))
		if syncFirst {
			require.NoError(b, sa.Synchronize())
			require.NoError(b, sb.Synchronize())
		}
		for _, r := range reqs {
			require.NoError(b, r.Wait(ctx), "iteration %d", it)
		}
		require.NoError(b, sa.Synchronize())
		require.NoError(b, sb.Synchronize())
		d, err := cuda.ElapsedTime(evStart, evEnd)
		require.NoError(b, err)
		launched += d
		st := stamps.Bytes()
		t0, t1 := binary.LittleEndian.Uint64(st), binary.LittleEndian.Uint64(st[8:])
		bArrived, bReady := binary.LittleEndian.Uint64(st[16:]), binary.LittleEndian.Uint64(st[24:])
		require.True(b, t0 < bArrived && bArrived <= bReady && bReady < t1, "iteration %d: stamps %d %d %d %d", it, t0, bArrived, bReady, t1)
		kernelNs += t1 - t0
		abNs += bArrived - t0
		baNs += t1 - bReady
		require.Equal(b, partSum(0, partBytes, seedA), binary.LittleEndian.Uint64(sumsB.Bytes()), "iteration %d: B's checksum", it)
		require.Equal(b, partSum(0, partBytes, seedB), binary.LittleEndian.Uint64(sumsA.Bytes()), "iteration %d: A's checksum", it)
	}
	b.StopTimer()
	require.Zero(b, binary.LittleEndian.Uint64(failures.Bytes()))
	half := float64(kernelNs) / 1e3 / float64(n) / 2
	b.ReportMetric(kflag, "kflag-us")
	b.ReportMetric(put, "put-us")
	b.ReportMetric(half, "half-rt-us")
	b.ReportMetric(float64(abNs)/1e3/float64(n), "a-to-b-us")
	b.ReportMetric(float64(baNs)/1e3/float64(n), "b-to-a-us")
	b.ReportMetric(launched.Seconds()*1e6/float64(n)/2, "launch-half-rt-us")
	b.ReportMetric(putMapped, "put-mapped-us")
	b.ReportMetric(half/(kflag+putMapped), "ratio")
	b.ReportMetric(half/(kflag+put), "ratio-alloc")
}

// putPingPong is half the round trip, in µs, of an 8-byte put-with-signal ping-pong
// between wa and wb (each side polls its signal word, progressing its worker). With g
// nil the buffers are UCX's allocations, the signal words host-backend words and the
// signal an add; else host-mapped pinned buffers, g's backend's words and SignalStore
// of the iteration, as prepared partitions use.
func putPingPong(b *testing.B, wa, wb *ucp.Worker, toA, toB *ucp.Endpoint, n int, g *gpu) float64 {
	var backend stream.Backend
	op, value := ucp.SignalAdd, func(uint64) uint64 { return 1 }
	if g != nil {
		backend = g.backend
		op, value = ucp.SignalStore, func(i uint64) uint64 { return i }
	} else {
		host, err := stream.Open(stream.Host)
		require.NoError(b, err)
		defer host.Close()
		backend = host
	}
	sigA, err := wa.NewSignals(backend, 1)
	require.NoError(b, err)
	defer sigA.Close()
	sigB, err := wb.NewSignals(backend, 1)
	require.NoError(b, err)
	defer sigB.Close()
	mem := func(w *ucp.Worker) *ucp.MemH {
		var m *ucp.MemH
		var err error
		if g == nil {
			m, err = w.Context().MemAlloc(8)
		} else {
			m, err = w.Context().MemMap(g.mapped(b, 8).Bytes())
		}
		require.NoError(b, err)
		return m
	}
	bufA, bufB := mem(wa), mem(wb)
	defer bufA.Close()
	defer bufB.Close()
	key := func(ep *ucp.Endpoint, packed []byte, err error) *ucp.Rkey {
		require.NoError(b, err)
		k, err := ep.UnpackRkey(packed)
		require.NoError(b, err)
		return k
	}
	pa, errA := sigA.PackRkey()
	pb, errB := sigB.PackRkey()
	sigKeyA, sigKeyB := key(toA, pa, errA), key(toB, pb, errB)
	pa, errA = bufA.PackRkey()
	pb, errB = bufB.PackRkey()
	bufKeyA, bufKeyB := key(toA, pa, errA), key(toB, pb, errB)
	defer func() {
		for _, k := range []*ucp.Rkey{sigKeyA, sigKeyB, bufKeyA, bufKeyB} {
			_ = k.Close()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srcA, srcB := make([]byte, 8), make([]byte, 8)
	await := func(w *ucp.Worker, word *stream.Word, v uint64) {
		for i := 0; word.Load() < v; i++ {
			w.Progress()
			if i&1023 == 1023 {
				require.NoError(b, ctx.Err())
			}
		}
	}
	errs := make(chan error, 1)
	go func() { // B echoes
		for i := uint64(1); i <= uint64(n); i++ {
			await(wb, sigB.Word(0), i)
			r, err := toA.PutSignalNbx(srcB, uint64(bufA.Address()), bufKeyA, ucp.Signal{Op: op, Value: value(i), Addr: sigA.Addr(0), Rkey: sigKeyA}, nil)
			if err == nil {
				err = r.Wait(ctx)
			}
			if err != nil {
				errs <- err
				return
			}
		}
		errs <- nil
	}()
	start := time.Now()
	for i := uint64(1); i <= uint64(n); i++ {
		r, err := toB.PutSignalNbx(srcA, uint64(bufB.Address()), bufKeyB, ucp.Signal{Op: op, Value: value(i), Addr: sigB.Addr(0), Rkey: sigKeyB}, nil)
		require.NoError(b, err)
		require.NoError(b, r.Wait(ctx))
		await(wa, sigA.Word(0), i)
	}
	elapsed := time.Since(start)
	require.NoError(b, <-errs)
	return elapsed.Seconds() * 1e6 / float64(n) / 2
}

// spinProgress progresses w in a loop, never yielding or sleeping, until stop, as
// ucx_perftest's processes poll (yielding between polls cost ~3 µs a direction, run
// 70 in docs/gpu-runs.md).
func spinProgress(w *ucp.Worker) (stop func()) { return pollWorker(w, func() {}) }

// echoFlag is the host side of a flag round trip: a goroutine that stores into done
// every new value it sees in trig, until the returned stop is called.
func echoFlag(trig, done *stream.Word) (stop func()) {
	quit := make(chan struct{})
	go func() {
		var seen uint64
		for {
			if v := trig.Load(); v != seen {
				seen = v
				done.Store(v)
				continue
			}
			select {
			case <-quit:
				return
			default:
			}
		}
	}()
	return func() { close(quit) }
}

// BenchmarkGPUPreparedDirectBandwidth: prepared partitions between two workers of one
// process (no context switch to pay), 8 partitions made ready in stream order
// (PreadyOnStream), the receiver waiting on the host, against a device-to-device
// cuMemcpyAsync of the whole buffer in the same run:
//
//	direct-GBps   ContextParams.Device: each partition one copy into the receiver's buffer
//	staged-GBps   no Device: each partition through a host copy of the buffer
//	copy-GBps     the raw copy
//	ratio         direct / copy (the copy engine is the floor)
//	ratio-staged  direct / staged
//
// and each mode's enqueue (Start on both sides and the PreadyOnStream calls), and the
// direct mode again with goroutines polling both workers (direct-polled-*).
//
// The receiver's buffer is checksummed on the device after the last iteration.
func BenchmarkGPUPreparedDirectBandwidth(b *testing.B) {
	for _, size := range []int{4 << 20, 64 << 20, 256 << 20} {
		b.Run(fmt.Sprintf("%dMiB", size>>20), func(b *testing.B) { preparedBandwidth(b, size) })
	}
}

func preparedBandwidth(b *testing.B, n int) {
	g := requireGPU(b)
	const parts = 8
	iters := max(b.N, 20)
	src, err := g.ctx.MemAlloc(n)
	require.NoError(b, err)
	defer src.Close()
	dst, err := g.ctx.MemAlloc(n)
	require.NoError(b, err)
	defer dst.Close()
	s := g.stream(b)
	cs, _ := stream.CUDAStream(s)
	require.NoError(b, cs.LaunchKernel(g.fill, cuda.Linear(1024, 256), src.Ptr(), uint64(n), uint32(7)))
	require.NoError(b, s.Synchronize())
	want := partSum(0, n, 7)

	// The floor: one device-to-device copy of the whole buffer.
	t0 := time.Now()
	for range iters {
		require.NoError(b, s.Copy(dst.Ptr(), src.Ptr(), n))
	}
	require.NoError(b, s.Synchronize())
	copyGBps := float64(n) * float64(iters) / time.Since(t0).Seconds() / 1e9

	run := func(device, polled bool) float64 {
		cp := ucp.ContextParams{}
		if device {
			cp.Device = g.backend
		}
		// Each side's Wait progresses its worker, in a goroutine of its own: a
		// progress thread or a spinning goroutine would contend for the worker's lock
		// with every enqueue (runs 110, 113).
		ws, wr, toR, toS := contextWorkers(b, cp, ucp.WorkerParams{})
		require.NoError(b, cs.MemsetD8(dst.Ptr(), 0, n))
		require.NoError(b, s.Synchronize())
		send, err := prepare.PsendInit(ws, ucp.DeviceBuffer(src.Ptr(), n), prepare.Params{Peer: toR, Tag: 0xb1, Partitions: parts, Backend: g.backend, MemoryType: ucp.MemoryCUDA})
		require.NoError(b, err)
		recv, err := prepare.PrecvInit(wr, ucp.DeviceBuffer(dst.Ptr(), n), prepare.Params{Peer: toS, Tag: 0xb1, Partitions: parts, Backend: g.backend, MemoryType: ucp.MemoryCUDA})
		require.NoError(b, err)
		defer func() {
			stop := progressWhile(ws) // the sender acknowledges the revocation of the receiver's buffer
			_ = recv.Free()
			stop()
			_ = send.Free()
		}()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		require.NoError(b, prepare.PrepareAll(ctx, send, recv))
		if polled {
			// Goroutines polling both workers meanwhile, as a user's progress loop
			// would: every enqueue contends with them for the worker's lock.
			stopS, stopR := spinProgress(ws), spinProgress(wr)
			defer stopS()
			defer stopR()
		}
		var enq, rwait, swait time.Duration
		iteration := func() {
			t0 := time.Now()
			require.NoError(b, recv.Start())
			require.NoError(b, send.Start())
			for p := range parts {
				require.NoError(b, send.PreadyOnStream(s, p))
			}
			t1 := time.Now()
			recvDone := make(chan time.Time, 1)
			go func() {
				if err := recv.Wait(ctx); err != nil {
					b.Error(err)
				}
				recvDone <- time.Now()
			}()
			require.NoError(b, send.Wait(ctx))
			t2 := time.Now()
			t3 := <-recvDone
			enq, rwait, swait = enq+t1.Sub(t0), rwait+t3.Sub(t1), swait+t2.Sub(t1)
		}
		iteration() // warm: mappings, staging memory
		enq, rwait, swait = 0, 0, 0
		t0 := time.Now()
		for range iters {
			iteration()
		}
		gbps := float64(n) * float64(iters) / time.Since(t0).Seconds() / 1e9
		mode := "staged"
		if device {
			mode = "direct"
		}
		if polled {
			mode += "-polled"
		}
		per := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(iters) }
		b.ReportMetric(per(enq), mode+"-enqueue-us")
		b.ReportMetric(per(rwait), mode+"-recv-done-us")
		b.ReportMetric(per(swait), mode+"-send-done-us")
		sum := g.deviceSum(b, s, dst.Ptr(), n)
		require.NoError(b, s.Synchronize())
		require.Equal(b, want, sum(), "the receiver's buffer (device=%v)", device)
		staged := ws.StagingStats().Bytes + wr.StagingStats().Bytes
		if device {
			require.Zero(b, staged, "the direct path stages nothing")
		}
		return gbps
	}
	direct := run(true, false)
	run(true, true)
	staged := run(false, false)
	b.ReportMetric(direct, "direct-GBps")
	b.ReportMetric(staged, "staged-GBps")
	b.ReportMetric(copyGBps, "copy-GBps")
	b.ReportMetric(direct/copyGBps, "ratio")
	b.ReportMetric(direct/staged, "ratio-staged")
}

// contextWorkers makes a context with cp and two workers of it with wp, connected both
// ways by worker address; the context closes when the test ends.
func contextWorkers(tb testing.TB, cp ucp.ContextParams, wp ucp.WorkerParams) (wa, wb *ucp.Worker, toB, toA *ucp.Endpoint) {
	tb.Helper()
	uctx, err := ucp.NewContext(cp)
	require.NoError(tb, err)
	tb.Cleanup(func() { _ = uctx.Close() })
	wa, err = uctx.NewWorker(wp)
	require.NoError(tb, err)
	wb, err = uctx.NewWorker(wp)
	require.NoError(tb, err)
	aa, err := wa.Address()
	require.NoError(tb, err)
	ab, err := wb.Address()
	require.NoError(tb, err)
	toB, err = wa.ConnectAddress(ab, &ucp.EndpointParams{NoPeerErrorHandling: true})
	require.NoError(tb, err)
	toA, err = wb.ConnectAddress(aa, &ucp.EndpointParams{NoPeerErrorHandling: true})
	require.NoError(tb, err)
	return wa, wb, toB, toA
}
