package cuda

/*
#include <stdlib.h>
#include <string.h>
#include "shim.h"
*/
import "C"

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"reflect"
	"strings"
	"sync"
	"unsafe"
)

// Module is a loaded CUmodule: PTX (JIT-compiled by the driver for the device),
// cubin or fatbin.
type Module struct {
	ctx *Context

	mu sync.RWMutex
	h  C.CUmodule // nil once unloaded
}

// jitLogSize bounds the JIT logs kept for errors.
const jitLogSize = 16 << 10

// LoadModule loads a module image from memory (cuModuleLoadDataEx). PTX is
// compiled for the context's device; when that fails the error matches
// ErrInvalidPTX (or ErrInvalidImage, ErrNoBinaryForGPU...) and its Detail holds
// the JIT compiler's log.
func (c *Context) LoadModule(image []byte) (*Module, error) {
	const op = "cuModuleLoadDataEx"
	h, err := c.raw(op)
	if err != nil {
		return nil, err
	}
	if len(bytes.TrimRight(image, "\x00")) == 0 {
		return nil, invalid(op, "empty module image")
	}
	// PTX must be NUL-terminated; a trailing NUL is harmless for binaries. C
	// memory, because the driver reads the image during the call only but
	// the image may be large and Go memory would need pinning anyway.
	img := C.malloc(C.size_t(len(image) + 1))
	defer C.free(img)
	dst := unsafe.Slice((*byte)(img), len(image)+1)
	copy(dst, image)
	dst[len(image)] = 0

	logs := (*C.char)(C.calloc(2, jitLogSize))
	defer C.free(unsafe.Pointer(logs))
	errLog := logs
	infoLog := (*C.char)(unsafe.Add(unsafe.Pointer(logs), jitLogSize))

	var m C.CUmodule
	r := C.ucpx_module_load_data(h, &m, img, errLog, jitLogSize, infoLog, jitLogSize)
	if r != 0 {
		e := newError(op, Result(r)).(*Error)
		detail := strings.TrimSpace(C.GoStringN(errLog, C.int(C.strnlen(errLog, jitLogSize))))
		if info := strings.TrimSpace(C.GoStringN(infoLog, C.int(C.strnlen(infoLog, jitLogSize)))); info != "" {
			detail = strings.TrimSpace(detail + "\n" + info)
		}
		if detail != "" {
			e.Detail = "JIT log:\n" + detail
		}
		return nil, e
	}
	return &Module{ctx: c, h: m}, nil
}

// Function looks up a kernel by its (extern "C") name.
func (m *Module) Function(name string) (*Function, error) {
	const op = "cuModuleGetFunction"
	if name == "" {
		return nil, invalid(op, "empty function name")
	}
	if m == nil {
		return nil, closedErr(op, "module")
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.h == nil {
		return nil, closedErr(op, "module")
	}
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	var f C.CUfunction
	if err := check(op, C.ucpx_module_get_function(m.ctx.h, &f, m.h, cname)); err != nil {
		if e, ok := err.(*Error); ok {
			e.Detail = "function " + name
		}
		return nil, err
	}
	return &Function{mod: m, h: f, name: name}, nil
}

// Close unloads the module (cuModuleUnload); its Functions stop working. A
// second Close returns an error matching ErrInvalidHandle.
func (m *Module) Close() error {
	if m == nil {
		return closedErr("cuModuleUnload", "module")
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.h == nil {
		return closedErr("cuModuleUnload", "module")
	}
	h := m.h
	m.h = nil
	return check("cuModuleUnload", C.ucpx_module_unload(m.ctx.h, h))
}

// Function is a kernel of a Module (CUfunction).
type Function struct {
	mod  *Module
	h    C.CUfunction
	name string
}

// Name is the kernel's name.
func (f *Function) Name() string { return f.name }

// Handle is the raw CUfunction.
func (f *Function) Handle() uintptr { return uintptr(unsafe.Pointer(f.h)) }

// raw read-locks the function's module; the caller unlocks f.mod.mu.
func (f *Function) raw(op string) (C.CUfunction, error) {
	if f == nil || f.mod == nil {
		return nil, closedErr(op, "function")
	}
	f.mod.mu.RLock()
	if f.mod.h == nil {
		f.mod.mu.RUnlock()
		return nil, closedErr(op, "module of function "+f.name)
	}
	return f.h, nil
}

// Dim3 is a grid or block size.
type Dim3 struct{ X, Y, Z uint32 }

// LaunchConfig is the geometry of a kernel launch.
type LaunchConfig struct {
	Grid, Block    Dim3
	SharedMemBytes uint32
}

// Linear returns a 1-D configuration of blocks×threads.
func Linear(blocks, threads uint32) LaunchConfig {
	return LaunchConfig{Grid: Dim3{blocks, 1, 1}, Block: Dim3{threads, 1, 1}}
}

func (c LaunchConfig) validate(op string) error {
	for _, d := range []Dim3{c.Grid, c.Block} {
		if d.X == 0 || d.Y == 0 || d.Z == 0 {
			return invalid(op, "zero launch dimension in grid %v block %v", c.Grid, c.Block)
		}
	}
	return nil
}

// kernelArgs are kernel argument values laid out in one Go buffer (no pointers in
// it, so it may be passed to C for the call) with the offset of each; the C side
// builds the driver's pointer array. Pooled: a launch allocates nothing for them.
type kernelArgs struct {
	flat []byte
	offs []uint32
}

var kernelArgsPool = sync.Pool{New: func() any { return &kernelArgs{flat: make([]byte, 0, 256), offs: make([]uint32, 0, 16)} }}

// c returns the C views of the arguments (nil pointers without arguments).
func (k *kernelArgs) c() (*C.uchar, *C.uint, C.int) {
	if len(k.offs) == 0 {
		return nil, nil, 0
	}
	return (*C.uchar)(unsafe.Pointer(&k.flat[0])), (*C.uint)(unsafe.Pointer(&k.offs[0])), C.int(len(k.offs))
}

func (k *kernelArgs) free() { kernelArgsPool.Put(k) }

// maxKernelArgs matches UCPX_MAX_KERNEL_ARGS in shim.h.
const maxKernelArgs = 64

// packArgs lays kernel arguments out for the driver. Accepted types: fixed-size
// integers and floats, int/uint (as 64-bit), uintptr (a device address),
// unsafe.Pointer is refused (say uintptr). Structs and arrays of those are
// passed by value, laid out with encoding/binary rules, which have no padding:
// declare Go structs with the fields and explicit padding of the C struct (a
// C struct of 8-byte members, like ucpx_device_handle, needs none). Each value
// starts at an 8-byte boundary.
func packArgs(op string, args []any) (*kernelArgs, error) {
	if len(args) > maxKernelArgs {
		return nil, invalid(op, "%d arguments, at most %d", len(args), maxKernelArgs)
	}
	k := kernelArgsPool.Get().(*kernelArgs)
	k.flat, k.offs = k.flat[:0], k.offs[:0]
	for i, a := range args {
		for len(k.flat)%8 != 0 {
			k.flat = append(k.flat, 0)
		}
		k.offs = append(k.offs, uint32(len(k.flat)))
		var err error
		if k.flat, err = appendArg(k.flat, a); err != nil {
			k.free()
			return nil, invalid(op, "argument %d: %v", i, err)
		}
	}
	return k, nil
}

// appendArg appends a's bytes to b.
func appendArg(b []byte, a any) ([]byte, error) {
	le := binary.LittleEndian
	switch v := a.(type) {
	case uint64:
		return le.AppendUint64(b, v), nil
	case uintptr:
		return le.AppendUint64(b, uint64(v)), nil
	case uint32:
		return le.AppendUint32(b, v), nil
	case int64:
		return le.AppendUint64(b, uint64(v)), nil
	case int32:
		return le.AppendUint32(b, uint32(v)), nil
	}
	v, err := argBytes(a)
	return append(b, v...), err
}

func argBytes(a any) ([]byte, error) {
	le := binary.LittleEndian
	switch v := a.(type) {
	case nil:
		return nil, fmt.Errorf("nil")
	case unsafe.Pointer:
		return nil, fmt.Errorf("unsafe.Pointer: pass a device address as uintptr")
	case int:
		return le.AppendUint64(nil, uint64(v)), nil
	case uint:
		return le.AppendUint64(nil, uint64(v)), nil
	case uintptr:
		return le.AppendUint64(nil, uint64(v)), nil
	case bool:
		if v {
			return []byte{1}, nil
		}
		return []byte{0}, nil
	case float32:
		return le.AppendUint32(nil, math.Float32bits(v)), nil
	case float64:
		return le.AppendUint64(nil, math.Float64bits(v)), nil
	}
	if k := reflect.TypeOf(a).Kind(); k == reflect.Pointer || k == reflect.Slice || k == reflect.String || k == reflect.Map {
		return nil, fmt.Errorf("%T cannot be passed to a kernel by value", a)
	}
	var buf bytes.Buffer
	if err := binary.Write(&buf, le, a); err != nil {
		return nil, fmt.Errorf("%T: %v", a, err)
	}
	return buf.Bytes(), nil
}

// LaunchKernel enqueues f on s. Each argument is passed by value; see packArgs
// for the accepted types. The values are copied during the call.
func (s *Stream) LaunchKernel(f *Function, cfg LaunchConfig, args ...any) error {
	const op = "cuLaunchKernel"
	if err := cfg.validate(op); err != nil {
		return err
	}
	return s.launch(op, f, args, func(fh C.CUfunction, flat *C.uchar, offs *C.uint, n C.int) C.CUresult {
		return C.ucpx_launch_kernel(s.ctx.h, fh,
			C.uint(cfg.Grid.X), C.uint(cfg.Grid.Y), C.uint(cfg.Grid.Z),
			C.uint(cfg.Block.X), C.uint(cfg.Block.Y), C.uint(cfg.Block.Z),
			C.uint(cfg.SharedMemBytes), s.h, flat, offs, n)
	})
}

// LaunchCopy launches f, a kernel taking (dst, src *u8, n u64) such as
// device.KernelCopy, on s with grid blocks of block threads: a copy of n bytes in
// stream order by the SMs, which costs the CPU one launch with no argument packing.
func (s *Stream) LaunchCopy(f *Function, grid, block uint32, dst, src uintptr, n int) error {
	_, err := s.launchCopy(f, grid, block, dst, src, n, false)
	return err
}

// LaunchCopyUncaptured is LaunchCopy unless s is capturing: then it enqueues nothing
// and returns the capture status (cuStreamIsCapturing and the launch in one call).
func (s *Stream) LaunchCopyUncaptured(f *Function, grid, block uint32, dst, src uintptr, n int) (CaptureStatus, error) {
	return s.launchCopy(f, grid, block, dst, src, n, true)
}

func (s *Stream) launchCopy(f *Function, grid, block uint32, dst, src uintptr, n int, uncaptured bool) (CaptureStatus, error) {
	const op = "cuLaunchKernel"
	if err := checkCopy(op, dst, src, n); err != nil {
		return CaptureNone, err
	}
	if grid == 0 || block == 0 {
		return CaptureNone, invalid(op, "grid %d, block %d", grid, block)
	}
	var st C.CUstreamCaptureStatus
	stp := (*C.CUstreamCaptureStatus)(nil)
	if uncaptured {
		stp = &st
	}
	err := s.withFunction(op, f, func(fh C.CUfunction) C.CUresult {
		return C.ucpx_launch_copy(s.ctx.h, fh, C.uint(grid), C.uint(block), C.CUdeviceptr(dst), C.CUdeviceptr(src), C.size_t(n), s.h, stp)
	})
	return CaptureStatus(st), err
}

// launch packs args and calls call with f's handle and the packed arguments while the
// stream and f's module are held open.
func (s *Stream) launch(op string, f *Function, args []any, call func(fh C.CUfunction, flat *C.uchar, offs *C.uint, n C.int) C.CUresult) error {
	params, err := packArgs(op, args)
	if err != nil {
		return err
	}
	defer params.free()
	flat, offs, n := params.c()
	return s.withFunction(op, f, func(fh C.CUfunction) C.CUresult { return call(fh, flat, offs, n) })
}

// withFunction calls call with f's handle while the stream and f's module are held
// open, and checks its result.
func (s *Stream) withFunction(op string, f *Function, call func(fh C.CUfunction) C.CUresult) error {
	if err := s.rlock(op); err != nil {
		return err
	}
	defer s.mu.RUnlock()
	fh, err := f.raw(op)
	if err != nil {
		return err
	}
	defer f.mod.mu.RUnlock()
	return check(op, call(fh))
}

// launchKernelRepeatC launches f n times from one C loop with its arguments packed
// once: the driver's own cost of cuLaunchKernel, which the benchmarks compare
// LaunchKernel with.
func (s *Stream) launchKernelRepeatC(f *Function, grid, block uint32, n int, args ...any) error {
	return s.launch("cuLaunchKernel", f, args, func(fh C.CUfunction, flat *C.uchar, offs *C.uint, nargs C.int) C.CUresult {
		return C.ucpx_launch_kernel_repeat(s.ctx.h, fh, C.uint(grid), C.uint(block), s.h, flat, offs, nargs, C.int(n))
	})
}
