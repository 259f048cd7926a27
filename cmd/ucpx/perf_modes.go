package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/ucpx/ucpx/cgo/cuda"
	"github.com/ucpx/ucpx/condition"
	"github.com/ucpx/ucpx/device"
	"github.com/ucpx/ucpx/stream"
	"github.com/ucpx/ucpx/ucp"
)

// Ways for a stream to drive the tag ping-pong (`ucpx perf --modes`), compared in one
// run; the peer process answers the same way for all of them:
//
//	plain     the host posts and waits (the UCP layer alone, like ucx_perftest)
//	sync      (a) synchronise the stream, then post and wait on the host
//	hostfunc  (b) a stream host function performs the blocking operation (MPIX_*_enqueue)
//	stream    (c) a Stream condition: the stream triggers, completion is stream-ordered
//	kernel    (d) a KernelTriggered condition: a kernel (a host goroutine on host
//	              streams) triggers each iteration and waits for its completion
const (
	modePlain    = "plain"
	modeSync     = "sync"
	modeHostFunc = "hostfunc"
	modeStream   = "stream"
	modeKernel   = "kernel"
)

var allModes = []string{modePlain, modeSync, modeHostFunc, modeStream, modeKernel}

func parseModes(s string) ([]string, error) {
	var out []string
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
	}
	return out, nil
}

// modeRig holds the stream machinery of the stream modes, opened once per run.
type modeRig struct {
	backend stream.Backend
	s       stream.Stream
	cs      *cuda.Stream // CUDA backend only
	mod     *cuda.Module
	kernel  *cuda.Function
	result  *cuda.HostMemory
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
			r.kernel, err = r.mod.Function(device.KernelHandle)
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

func (r *modeRig) close() {
	if r.s != nil {
		_ = r.s.Close()
	}
	if r.result != nil {
		_ = r.result.Close()
	}
	if r.mod != nil {
		_ = r.mod.Close()
	}
	_ = r.backend.Close()
}

// tagLatMode runs count ping-pong iterations driven the way mode says and returns the
// total time; only the total is observable when the stream runs ahead of the host.
func (s *perfSide) tagLatMode(ctx context.Context, r *modeRig, mode string, size, count int) (time.Duration, error) {
	sbuf, rbuf := s.smem.Bytes()[:size], s.rmem.Bytes()[:size]
	roundTrip := func() error {
		sr, err := s.ep.TagSendNbx(sbuf, tagPing, &ucp.RequestParam{MemH: s.smem})
		if err != nil {
			return err
		}
		rr, err := s.w.TagRecvNbx(rbuf, tagPong, fullMask, &ucp.RequestParam{MemH: s.rmem})
		if err != nil {
			return err
		}
		if err := s.wait(ctx, rr); err != nil {
			return err
		}
		if err := s.wait(ctx, sr); err != nil {
			return err
		}
		return checkLen(rr, size)
	}
	start := time.Now()
	switch mode {
	case modeSync:
		for i := 0; i < count; i++ {
			if err := r.s.Synchronize(); err != nil {
				return 0, err
			}
			if err := roundTrip(); err != nil {
				return 0, err
			}
		}
	case modeHostFunc:
		var failed error
		for i := 0; i < count; i++ {
			if err := r.s.LaunchHostFunc(func() {
				if err := roundTrip(); err != nil && failed == nil {
					failed = err
				}
			}); err != nil {
				return 0, err
			}
		}
		if err := r.s.Synchronize(); err != nil {
			return 0, err
		}
		if failed != nil {
			return 0, failed
		}
	case modeStream, modeKernel:
		p := condition.Param{Category: condition.Stream, Backend: r.backend, Stream: r.s}
		if mode == modeKernel {
			p = condition.Param{Category: condition.KernelTriggered, Backend: r.backend}
		}
		cond, err := condition.Create(p)
		if err != nil {
			return 0, err
		}
		sp := &ucp.RequestParam{Condition: cond, MemH: s.smem, Peer: s.ep}
		rp := &ucp.RequestParam{Condition: cond, MemH: s.rmem, Peer: s.ep}
		for i := 0; i < count; i++ {
			if _, err := s.ep.TagSendNbx(sbuf, tagPing, sp); err != nil {
				return 0, err
			}
			if _, err := s.w.TagRecvNbx(rbuf, tagPong, fullMask, rp); err != nil {
				return 0, err
			}
			if mode == modeKernel {
				if err := r.fire(cond); err != nil {
					return 0, err
				}
			}
		}
		if err := r.s.Synchronize(); err != nil {
			return 0, err
		}
		elapsed := time.Since(start)
		if err := cond.Err(); err != nil {
			return 0, err
		}
		return elapsed, cond.Destroy()
	default:
		return 0, fmt.Errorf("mode %q is not a stream mode", mode)
	}
	return time.Since(start), nil
}

// fire triggers the operations armed so far and, on host streams, waits for them as a
// kernel's ucpx_wait would; on a GPU a one-thread kernel does both.
func (r *modeRig) fire(cond *condition.Condition) error {
	h, err := cond.DeviceHandle()
	if err != nil {
		return err
	}
	if r.cs == nil {
		if err := condition.Trigger(h); err != nil {
			return err
		}
		for !condition.Test(h) {
		}
		return nil
	}
	return r.cs.LaunchKernel(r.kernel, cuda.Linear(1, 1), h.Kernel(), r.result.DevicePtr())
}
