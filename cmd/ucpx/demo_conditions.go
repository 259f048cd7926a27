package main

import (
	"context"
	"fmt"

	"github.com/ucpx/ucpx/cgo/cuda"
	"github.com/ucpx/ucpx/condition"
	"github.com/ucpx/ucpx/device"
	"github.com/ucpx/ucpx/stream"
	"github.com/ucpx/ucpx/ucp"
)

// conditionSteps are the condition-triggered exchanges of the demo: a tag echo whose
// send and receive are enqueued on a stream (stream-ordered: a function enqueued after
// them checks the echoed data), and one whose operations start when a trigger fires —
// a kernel on a GPU, a host goroutine on host streams.
func conditionSteps() []demoStep {
	return []demoStep{
		{name: "stream-triggered tag echo 64 KiB", run: func(ctx context.Context, d *demoParent) (demoResult, error) {
			return d.conditionEcho(ctx, 100, 64<<10, condition.Stream)
		}},
		{name: "kernel-triggered tag echo 64 KiB", run: func(ctx context.Context, d *demoParent) (demoResult, error) {
			return d.conditionEcho(ctx, 101, 64<<10, condition.KernelTriggered)
		}},
	}
}

func (d *demoParent) conditionEcho(ctx context.Context, step, size int, cat condition.Category) (demoResult, error) {
	res := demoResult{}
	backend, err := stream.Open(stream.Auto) // CUDA where there is a GPU, host streams otherwise
	if err != nil {
		return res, err
	}
	defer backend.Close()
	s, err := backend.NewStream()
	if err != nil {
		return res, err
	}
	defer s.Close()
	p := condition.Param{Category: cat, Backend: backend}
	if cat == condition.Stream {
		p.Stream = s
	}
	cond, err := condition.Create(p)
	if err != nil {
		return res, err
	}
	defer cond.Destroy()

	tag := demoTagData + uint64(step)
	data := patternBytes(size, int64(step))
	want := crc(data)
	res.CRC32C = fmt.Sprintf("%08x", want)
	if err := d.sendCtl(ctx, demoCtl{Op: "echo", Tag: tag, Size: size}); err != nil {
		return res, err
	}
	echo := make([]byte, size)
	prm := &ucp.RequestParam{Condition: cond, Peer: d.ep}
	sr, err := d.ep.TagSendNbx(data, tag, prm)
	if err != nil {
		return res, err
	}
	rr, err := d.w.TagRecvNbx(echo, tag, fullMask, prm)
	if err != nil {
		return res, err
	}
	var seen uint32
	if cat == condition.Stream {
		// Stream order: this runs only after the echo has arrived.
		if err := s.LaunchHostFunc(func() { seen = crc(echo) }); err != nil {
			return res, err
		}
	} else {
		release, err := fireTrigger(backend, s, cond)
		if err != nil {
			return res, err
		}
		defer release() // after the Synchronize below: the kernel is done with it
	}
	if err := sr.Wait(ctx); err != nil {
		return res, fmt.Errorf("send: %w", err)
	}
	if err := rr.Wait(ctx); err != nil {
		return res, fmt.Errorf("receive echo: %w", err)
	}
	if err := s.Synchronize(); err != nil {
		return res, err
	}
	if cat == condition.KernelTriggered {
		seen = crc(echo)
	}
	return res, d.echoVerified(ctx, &res, size, want, rr.Length(), seen, "echo seen in stream order")
}

// fireTrigger starts a kernel-triggered condition's operations: on a GPU a kernel
// (device/test_kernels.cu ucpx_test_handle) triggers and waits on the device; on host
// streams the host trigger function does.
// The returned release frees what the kernel used; call it once s is synchronized.
func fireTrigger(backend stream.Backend, s stream.Stream, cond *condition.Condition) (release func(), err error) {
	h, err := cond.DeviceHandle()
	if err != nil {
		return nil, err
	}
	ctx, _, ok := stream.CUDAContext(backend)
	if !ok {
		return func() {}, condition.Trigger(h)
	}
	mod, err := ctx.LoadModule(device.TestKernelsPTX())
	if err != nil {
		return nil, err
	}
	fn, err := mod.Function(device.KernelHandle)
	if err != nil {
		_ = mod.Close()
		return nil, err
	}
	result, err := ctx.MemHostAlloc(16, cuda.HostAllocPortable|cuda.HostAllocDeviceMap)
	if err != nil {
		_ = mod.Close()
		return nil, err
	}
	release = func() {
		_ = result.Close()
		_ = mod.Close()
	}
	cs, _ := stream.CUDAStream(s)
	if err := cs.LaunchKernel(fn, cuda.Linear(1, 1), h.Kernel(), result.DevicePtr()); err != nil {
		release()
		return nil, err
	}
	return release, nil
}
