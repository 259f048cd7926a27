package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"runtime"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/ucpx/ucpx/cgo/cuda"
	"github.com/ucpx/ucpx/condition"
	"github.com/ucpx/ucpx/device"
	"github.com/ucpx/ucpx/internal/pingpong"
	"github.com/ucpx/ucpx/internal/runahead"
	"github.com/ucpx/ucpx/stream"
	"github.com/ucpx/ucpx/ucp"
)

// Ways for a stream to drive the tag ping-pong (`ucpx perf --modes`), compared in one
// run; the peer process answers the same way for all of them. One iteration is one
// round trip: a ping of the message size out, the peer's pong back.
//
//	plain     the host posts the send and the receive and waits (the UCP layer alone,
//	          like ucx_perftest); no stream
//	sync      (a) synchronize the stream, then post the send and the receive and wait
//	          for both on the host
//	hostfunc  (b) a stream host function posts both and waits for them (the blocking
//	          round trip of MPICH's MPIX_*_enqueue); the host only enqueues, at most
//	          runahead.StreamWindow iterations ahead, as in stream
//	stream    (c) a Stream condition: the send, then the receive, in one group
//	          (Condition.BeginGroup/EndGroup, as MPIX Irecv_enqueue, Isend_enqueue,
//	          Waitall_enqueue): one trigger store and one completion wait on the
//	          stream, enqueued in one call, and one stream-to-proxy round trip per
//	          iteration
//	kernel    (d) a KernelTriggered condition: one persistent kernel (a host goroutine
//	          on host streams) runs every iteration, triggering the receive and the
//	          receive of iteration k with the handle's values plus 2k and waiting for
//	          their completion; the host keeps arming iterations up to runahead.KernelWindow
//	          ahead of completion while it runs
//
// With --work kernel, sync, hostfunc and stream also run as mode+work: each iteration
// first enqueues a producer that writes the send buffer, as when kernels produce the
// data (CUDA: ucpx_test_fill, one block of 256 threads per 4 KiB; host streams: a host function
// doing the same). sync must then really wait for the stream. kernel has no +work
// variant: its persistent kernel occupies the stream, so no producer kernel can run
// between its iterations.
const (
	modePlain    = "plain"
	modeSync     = "sync"
	modeHostFunc = "hostfunc"
	modeStream   = "stream"
	modeKernel   = "kernel"

	workSuffix = "+work"
)

var allModes = []string{modePlain, modeSync, modeHostFunc, modeStream, modeKernel}

// takesWork: the modes that get a +work variant.
func takesWork(mode string) bool {
	return mode == modeSync || mode == modeHostFunc || mode == modeStream
}

// parseModes parses --modes and, with --work kernel, adds mode+work after each mode
// that takes a producer.
func parseModes(s, work string) ([]string, error) {
	switch work {
	case "none", "kernel":
	default:
		return nil, fmt.Errorf("--work %q: want none or kernel", work)
	}
	var out []string
	withWork := false
	for _, m := range strings.Split(s, ",") {
		m = strings.TrimSpace(m)
		ok := false
		for _, known := range allModes {
			ok = ok || m == known
		}
		if !ok {
			return nil, fmt.Errorf("--modes: unknown mode %q (want %s)", m, strings.Join(allModes, ","))
		}
		out = append(out, m)
		if work == "kernel" && takesWork(m) {
			out = append(out, m+workSuffix)
			withWork = true
		}
	}
	if work == "kernel" && !withWork {
		return nil, fmt.Errorf("--work kernel: none of --modes %s takes work (sync, hostfunc, stream do)", s)
	}
	return out, nil
}

// checkPongs (--check) makes rp's completion callback count the wrong bytes of each
// pong, as the proxy retires its receive. The buffer is not cleared: the next
// iteration's receive may already be posted into it, and every pong holds the same
// bytes.
func (s *perfSide) checkPongs(rp *ucp.RequestParam, rbuf []byte) {
	if !s.check {
		return
	}
	want, retire := s.smem.Bytes()[:len(rbuf)], rp.Callback
	rp.Callback = func(r *ucp.Request) {
		if r.Err() == nil {
			s.checkRecv(rbuf, want, false)
		}
		retire(r)
	}
}

// fitModes applies --modes to the tests it fits, tag_lat: with a stream mode and no
// --tests, only tag_lat runs; --tests naming another test with a stream mode, or a
// --backend without one, is refused rather than ignored.
func (o *perfOptions) fitModes(testsSet, backendSet bool) error {
	if _, err := stream.ParseSelection(o.backend); err != nil { // a usage error (status 2)
		return fmt.Errorf("--backend %q: want auto, host or cuda", o.backend)
	}
	var stream []string
	for _, m := range o.modes {
		if m != modePlain {
			stream = append(stream, m)
		}
	}
	if len(stream) == 0 {
		if backendSet {
			return fmt.Errorf("--backend %s: only the stream modes use a stream backend (--modes %s)", o.backend, strings.Join(allModes[1:], ","))
		}
		return nil
	}
	if !testsSet {
		o.tests = []string{testTagLat}
		return nil
	}
	for _, t := range o.tests {
		if t != testTagLat {
			return fmt.Errorf("--modes %s: the stream modes drive tag_lat only, not %s (run %s with --modes plain, in a run of its own)", strings.Join(stream, ","), t, t)
		}
	}
	return nil
}

// modeRig holds the stream machinery of the stream modes, opened once per run, and
// their registered buffers: on CUDA, pinned host memory the device can write (the
// +work producer), registered with UCX.
type modeRig struct {
	backend  stream.Backend
	s        stream.Stream
	cs       *cuda.Stream // CUDA backend only
	mod      *cuda.Module
	pingpong *cuda.Function
	fill     *cuda.Function
	result   *cuda.HostMemory // the ping-pong kernel's iteration count and time

	smem, rmem *ucp.MemH          // send and receive buffers, made by buffers
	sdev       uintptr            // CUDA: device address of smem
	pinned     []*cuda.HostMemory // CUDA: the memory behind smem and rmem
}

func openModeRig(sel string) (*modeRig, error) {
	selection, err := stream.ParseSelection(sel)
	if err != nil {
		return nil, err
	}
	b, err := stream.Open(selection)
	if err != nil {
		return nil, err
	}
	r := &modeRig{backend: b}
	if r.s, err = b.NewStream(); err != nil {
		r.close()
		return nil, err
	}
	if ctx, _, ok := stream.CUDAContext(b); ok {
		r.cs, _ = stream.CUDAStream(r.s)
		if r.mod, err = ctx.LoadModule(device.TestKernelsPTX()); err == nil {
			r.pingpong, err = r.mod.Function(device.KernelPingPong)
		}
		if err == nil {
			r.fill, err = r.mod.Function(device.KernelFill)
		}
		if err == nil {
			r.result, err = ctx.MemHostAlloc(16, cuda.HostAllocPortable|cuda.HostAllocDeviceMap)
		}
		if err != nil {
			r.close()
			return nil, fmt.Errorf("test kernels: %w", err)
		}
	}
	return r, nil
}

// buffers makes the rig's send and receive buffers of size bytes on first use (UCX's
// context exists only once the rig is open).
func (r *modeRig) buffers(uctx *ucp.Context, size int) error {
	if r.smem != nil {
		return nil
	}
	ctx, _, ok := stream.CUDAContext(r.backend)
	if !ok {
		var err error
		if r.smem, err = uctx.MemAlloc(size); err == nil {
			r.rmem, err = uctx.MemAlloc(size)
		}
		return err
	}
	mems := [2]**ucp.MemH{&r.smem, &r.rmem}
	for _, m := range mems {
		h, err := ctx.MemHostAlloc(size, cuda.HostAllocPortable|cuda.HostAllocDeviceMap)
		if err != nil {
			return fmt.Errorf("pinned buffer: %w", err)
		}
		r.pinned = append(r.pinned, h)
		if *m, err = uctx.MemMapPtr(h.Addr(), size, ucp.MemoryHost); err != nil {
			return fmt.Errorf("register pinned buffer: %w", err)
		}
	}
	r.sdev = r.pinned[0].DevicePtr()
	return nil
}

func (r *modeRig) close() {
	if r.s != nil {
		_ = r.s.Close()
	}
	// Deregister before the memory behind the registrations goes.
	for _, m := range []*ucp.MemH{r.smem, r.rmem} {
		if m != nil {
			_ = m.Close()
		}
	}
	for _, h := range r.pinned {
		_ = h.Close()
	}
	if r.result != nil {
		_ = r.result.Close()
	}
	if r.mod != nil {
		_ = r.mod.Close()
	}
	_ = r.backend.Close()
}

// produce enqueues iteration i's producer: it writes device.Pattern with pingpong.WorkSeed(i)
// into the first size bytes of the send buffer.
func (r *modeRig) produce(size, i int) error {
	if r.cs != nil {
		return r.cs.LaunchKernel(r.fill, cuda.Linear(pingpong.ProducerBlocks(size), 256), r.sdev, uint64(size), pingpong.WorkSeed(i))
	}
	buf := r.smem.Bytes()[:size]
	return r.s.LaunchHostFunc(func() { fillPattern(buf, pingpong.WorkSeed(i)) })
}

func fillPattern(buf []byte, seed uint32) {
	for i := range buf {
		buf[i] = device.Pattern(uint64(i), seed)
	}
}

// tagLatMode runs count ping-pong iterations driven the way mode says and returns the
// total time; only the total is observable when the stream runs ahead of the host.
func (s *perfSide) tagLatMode(ctx context.Context, r *modeRig, mode string, size, count int) (time.Duration, error) {
	if err := r.buffers(s.ctx, s.smem.Len()); err != nil {
		return 0, err
	}
	base, work := strings.CutSuffix(mode, workSuffix)
	if work && !takesWork(base) {
		return 0, fmt.Errorf("mode %q takes no work", mode)
	}
	produce := func(int) error { return nil }
	if work {
		produce = func(i int) error { return r.produce(size, i) }
	}
	sbuf, rbuf := r.smem.Bytes()[:size], r.rmem.Bytes()[:size]
	want := s.smem.Bytes()[:size] // the peer's pongs hold its send buffer, alike
	if s.check && !work {
		// What the peer expects: a +work mode before may have left its pattern here.
		copy(r.smem.Bytes(), s.smem.Bytes())
	}
	roundTrip := func() error {
		sr, err := s.ep.TagSendNbx(sbuf, tagPing, &ucp.RequestParam{MemH: r.smem})
		if err != nil {
			return err
		}
		rr, err := s.w.TagRecvNbx(rbuf, tagPong, fullMask, &ucp.RequestParam{MemH: r.rmem})
		if err != nil {
			return err
		}
		if err := s.wait(ctx, rr); err != nil {
			return err
		}
		if err := s.wait(ctx, sr); err != nil {
			return err
		}
		if s.check {
			s.checkRecv(rbuf, want, true)
		}
		return checkLen(rr, size)
	}
	var elapsed time.Duration
	var err error
	start := time.Now()
	switch base {
	case modeSync:
		for i := 0; i < count && err == nil; i++ {
			if i&s.progressMask == 0 {
				s.progress.Store(int64(i))
			}
			err = produce(i)
			if err == nil {
				err = r.s.Synchronize()
			}
			if err == nil {
				err = roundTrip()
			}
		}
		elapsed = time.Since(start)
	case modeHostFunc:
		var failed error // written on the stream, read after Synchronize
		// The same bounded run-ahead as stream: the host thread keeps enqueuing beside
		// the stream in both.
		ahead := runahead.New(runahead.StreamWindow)
		for i := 0; i < count && err == nil; i++ {
			if i&s.progressMask == 0 {
				s.progress.Store(int64(i))
			}
			err = ahead.Ahead(ctx, i, count)
			if err == nil {
				err = produce(i)
			}
			if err == nil {
				err = r.s.LaunchHostFunc(func() {
					if err := roundTrip(); err != nil && failed == nil {
						failed = err
					}
					ahead.Done()
				})
			}
		}
		if err == nil {
			err = r.s.Synchronize()
		}
		elapsed = time.Since(start)
		if err == nil {
			err = failed
		}
	case modeStream:
		elapsed, err = s.streamMode(ctx, r, size, count, produce)
	case modeKernel:
		elapsed, err = s.kernelMode(ctx, r, size, count)
	default:
		err = fmt.Errorf("mode %q is not a stream mode", mode)
	}
	if err != nil {
		return 0, err
	}
	if work {
		// The last producer ran, in stream order, before the stream returned.
		for i, b := range sbuf {
			if want := device.Pattern(uint64(i), pingpong.WorkSeed(count-1)); b != want {
				return 0, fmt.Errorf("%w: %s: send buffer byte %d is %#x after the last producer, want %#x", pingpong.ErrCheck, mode, i, b, want)
			}
		}
	}
	return elapsed, nil
}

// streamMode is mode (c): per iteration the producer (if any), the send and the receive
// as trigger stores, and one wait for both. The host enqueues at most
// runahead.StreamWindow iterations ahead of the completed ones.
func (s *perfSide) streamMode(ctx context.Context, r *modeRig, size, count int, produce func(int) error) (time.Duration, error) {
	cond, err := condition.Create(condition.Param{Category: condition.Stream, Backend: r.backend, Stream: r.s})
	if err != nil {
		return 0, err
	}
	chk := pingpong.NewCheck(size, runahead.StreamWindow)
	sp, rp := chk.Params(cond, r.smem, r.rmem, s.ep)
	sbuf, rbuf := r.smem.Bytes()[:size], r.rmem.Bytes()[:size]
	s.checkPongs(rp, rbuf)
	start := time.Now()
	for i := 0; i < count; i++ {
		if i&s.progressMask == 0 {
			s.progress.Store(int64(i))
		}
		if err := chk.Ahead(ctx, i, count); err != nil {
			return 0, err
		}
		if err := produce(i); err != nil {
			return 0, err
		}
		// The send first, as sync does: the receive is posted while the ping flies
		// (a pong arriving before it waits in UCX's unexpected queue).
		if err := cond.BeginGroup(); err != nil {
			return 0, err
		}
		if _, err := s.ep.TagSendNbx(sbuf, tagPing, sp); err != nil {
			return 0, err
		}
		if _, err := s.w.TagRecvNbx(rbuf, tagPong, fullMask, rp); err != nil {
			return 0, err
		}
		if err := cond.EndGroup(); err != nil {
			return 0, err
		}
	}
	if err := r.s.Synchronize(); err != nil {
		return 0, err
	}
	elapsed := time.Since(start)
	if err := chk.Verify(cond, count); err != nil {
		return 0, err
	}
	return elapsed, cond.Destroy()
}

// kernelMode is mode (d): one persistent kernel, or a host goroutine on host streams,
// triggers and waits for every iteration, while the host arms them ahead.
func (s *perfSide) kernelMode(ctx context.Context, r *modeRig, size, count int) (time.Duration, error) {
	cond, err := condition.Create(condition.Param{Category: condition.KernelTriggered, Backend: r.backend})
	if err != nil {
		return 0, err
	}
	chk := pingpong.NewCheck(size, runahead.KernelWindow)
	sp, rp := chk.Params(cond, r.smem, r.rmem, s.ep)
	sbuf, rbuf := r.smem.Bytes()[:size], r.rmem.Bytes()[:size]
	s.checkPongs(rp, rbuf)
	armed := 0
	arm := func() error { // one iteration: two sequence numbers, the send first
		if armed&s.progressMask == 0 {
			s.progress.Store(int64(armed)) // armed, at most runahead.KernelWindow ahead
		}
		armed++
		if _, err := s.ep.TagSendNbx(sbuf, tagPing, sp); err != nil {
			return err
		}
		_, err := s.w.TagRecvNbx(rbuf, tagPong, fullMask, rp)
		return err
	}
	const step = 2
	if err := arm(); err != nil {
		return 0, err
	}
	h, err := cond.DeviceHandle() // iteration 0; iteration k is h + k*step
	if err != nil {
		return 0, err
	}
	start := time.Now()
	finished, err := r.startPingPong(ctx, h, count, step)
	if err != nil {
		return 0, err
	}
	if err := chk.ArmAhead(ctx, count, arm); err != nil {
		return 0, err
	}
	if err := finished(); err != nil {
		return 0, err
	}
	elapsed := time.Since(start)
	if err := chk.Verify(cond, count); err != nil {
		return 0, err
	}
	return elapsed, cond.Destroy()
}

// startPingPong starts the trigger-and-wait loop of n iterations from h, step apart,
// and returns the function that waits for its end: on CUDA the ucpx_test_pingpong
// kernel, on host streams a goroutine doing what the kernel does.
func (r *modeRig) startPingPong(ctx context.Context, h condition.DeviceHandle, n int, step uint64) (func() error, error) {
	if r.cs != nil {
		res := r.result.Bytes()
		clear(res)
		if err := r.cs.LaunchKernel(r.pingpong, cuda.Linear(1, 1), h.Kernel(), uint64(n), step, r.result.DevicePtr()); err != nil {
			return nil, err
		}
		return func() error {
			if err := r.s.Synchronize(); err != nil {
				return err
			}
			if got := binary.LittleEndian.Uint64(res); got != uint64(n) {
				return fmt.Errorf("%w: the ping-pong kernel ran %d iterations, want %d", pingpong.ErrCheck, got, n)
			}
			return nil
		}, nil
	}
	done := make(chan error, 1)
	go func() { done <- hostPingPong(ctx, h, n, step) }()
	return func() error { return <-done }, nil
}

// hostPingPong is ucpx_test_pingpong on the host: condition.Trigger for ucpx_trigger,
// polling condition.Test for ucpx_wait.
func hostPingPong(ctx context.Context, h condition.DeviceHandle, n int, step uint64) error {
	for k := 0; k < n; k++ {
		it := h
		it.Value += uint64(k) * step
		it.CompletionValue += uint64(k) * step
		if err := condition.Trigger(it); err != nil {
			return err
		}
		// Yield now and then: on a GPU the kernel takes no CPU from the goroutine that
		// arms ahead, and on a small machine a spinning goroutine would.
		for spins := 1; !condition.Test(it); spins++ {
			if spins%16 == 0 {
				runtime.Gosched()
				if ctx.Err() != nil {
					return fmt.Errorf("ping-pong iteration %d of %d: %w", k, n, context.Cause(ctx))
				}
			}
		}
	}
	return nil
}

// modeComparison is one cell of the conditions target, "(c) beats (a) and (b)", taken
// from one run: Mode (stream, or stream+work) against Against (sync or hostfunc, with
// the same work) at Size. Ratio is Mode's mean one-way latency over Against's: below 1,
// (c) is faster. Both sides come from the same run, because a cell moves by up to 20 %
// between fresh machines (docs/performance.md).
type modeComparison struct {
	Size    int     `json:"size"`
	Mode    string  `json:"mode"`
	Against string  `json:"against"`
	Ratio   float64 `json:"ratio"`
}

// compareModes returns (c) against (a) and (b), with and without work, at every tag_lat
// size where the run measured both sides, sizes in the order the run measured them.
func compareModes(results []perfResult) []modeComparison {
	lat := map[string]map[int]float64{}
	var sizes []int
	for _, r := range results {
		if r.Test != testTagLat || r.Mode == "" || !(r.LatAvgUs > 0) {
			continue
		}
		if lat[r.Mode] == nil {
			lat[r.Mode] = map[int]float64{}
		}
		lat[r.Mode][r.Size] = r.LatAvgUs
		if !slices.Contains(sizes, r.Size) {
			sizes = append(sizes, r.Size)
		}
	}
	var out []modeComparison
	for _, size := range sizes {
		for _, work := range []string{"", workSuffix} {
			c, ok := lat[modeStream+work][size]
			if !ok {
				continue
			}
			for _, against := range []string{modeSync, modeHostFunc} {
				if other, ok := lat[against+work][size]; ok {
					out = append(out, modeComparison{Size: size, Mode: modeStream + work, Against: against + work, Ratio: c / other})
				}
			}
		}
	}
	return out
}

// printComparisons prints compareModes' cells as a table: a row per size, a column per
// pair.
func printComparisons(w io.Writer, cells []modeComparison) {
	if len(cells) == 0 {
		return
	}
	var pairs []string
	var sizes []int
	ratio := map[string]map[int]float64{}
	for _, c := range cells {
		pair := c.Mode + "/" + c.Against
		if ratio[pair] == nil {
			ratio[pair] = map[int]float64{}
			pairs = append(pairs, pair)
		}
		ratio[pair][c.Size] = c.Ratio
		if !slices.Contains(sizes, c.Size) {
			sizes = append(sizes, c.Size)
		}
	}
	fmt.Fprintln(w, "stream against sync and hostfunc (with the same work), this run: column A/B is mode A's mean one-way latency over mode B's; below 1, A is faster")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "size\t%s\t\n", strings.Join(pairs, "\t"))
	for _, size := range sizes {
		row := []string{fmtSize(size)}
		for _, pair := range pairs {
			if r, ok := ratio[pair][size]; ok {
				row = append(row, fmt.Sprintf("%.3f", r))
			} else {
				row = append(row, "-")
			}
		}
		fmt.Fprintf(tw, "%s\t\n", strings.Join(row, "\t"))
	}
	_ = tw.Flush()
}
