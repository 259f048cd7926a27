package cuda_test

// Tests that need no GPU: they run (not skip) on every machine.

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/ucpx/ucpx/cgo/cuda"
)

func TestLoadMissingLibrary(t *testing.T) {
	err := cuda.LoadLibrary("libcuda-ucpx-test-does-not-exist.so.1")
	mustIs(t, err, cuda.ErrNoDriver)
	mustIs(t, err, cuda.ErrNoLibrary)
	if !strings.Contains(err.Error(), "libcuda-ucpx-test-does-not-exist.so.1") {
		t.Errorf("error does not name the library: %v", err)
	}
}

func TestLoadLibraryWithoutSymbols(t *testing.T) {
	// A real shared library that is not a CUDA driver: Load must refuse it
	// cleanly (ErrNoDriver) and leave the function table untouched.
	err := cuda.LoadLibrary("libc.so.6")
	mustIs(t, err, cuda.ErrNoDriver)
	if errors.Is(err, cuda.ErrNoLibrary) {
		t.Errorf("libc was found, the error should be about symbols: %v", err)
	}
	if !strings.Contains(err.Error(), "cuInit") {
		t.Errorf("error does not name the missing symbol: %v", err)
	}
}

func TestNoDriverEverywhere(t *testing.T) {
	err := cuda.Load()
	if err == nil {
		t.Skip("a CUDA driver is present")
	}
	mustIs(t, err, cuda.ErrNoDriver)
	if err2 := cuda.Load(); err2 != err {
		t.Errorf("Load is not cached: %v then %v", err, err2)
	}
	_, err = cuda.DeviceCount()
	mustIs(t, err, cuda.ErrNoDriver)
	_, err = cuda.GetDevice(0)
	mustIs(t, err, cuda.ErrNoDriver)
	_, err = cuda.DriverVersion()
	mustIs(t, err, cuda.ErrNoDriver)
	_, err = cuda.StreamFromHandle(1)
	mustIs(t, err, cuda.ErrNoDriver)
	_, err = cuda.ContextFromHandle(1)
	mustIs(t, err, cuda.ErrNoDriver)
	_, err = cuda.CurrentContext()
	mustIs(t, err, cuda.ErrNoDriver)
	mustIs(t, cuda.ClearCurrent(), cuda.ErrNoDriver)
	// A Device value made without the driver answers with an error, not a crash.
	_, err = cuda.Device{}.Name()
	mustIs(t, err, cuda.ErrNotSupported)
	_, err = cuda.Device{}.RetainPrimaryContext()
	mustIs(t, err, cuda.ErrNoDriver)
	for _, s := range cuda.Symbols() {
		if s.Loaded {
			t.Errorf("%s reported loaded without a driver", s.Name)
		}
	}
}

func TestResultNames(t *testing.T) {
	cases := map[cuda.Result]string{
		0:   "CUDA_SUCCESS",
		1:   "CUDA_ERROR_INVALID_VALUE",
		100: "CUDA_ERROR_NO_DEVICE",
		218: "CUDA_ERROR_INVALID_PTX",
		400: "CUDA_ERROR_INVALID_HANDLE",
		600: "CUDA_ERROR_NOT_READY",
		700: "CUDA_ERROR_ILLEGAL_ADDRESS",
		801: "CUDA_ERROR_NOT_SUPPORTED",
		999: "CUDA_ERROR_UNKNOWN",
	}
	for code, name := range cases {
		if got := code.String(); got != name {
			t.Errorf("Result(%d) = %q, want %q", code, got, name)
		}
	}
	if got := cuda.Result(123456).String(); got != "CUDA_ERROR(123456)" {
		t.Errorf("unknown code named %q", got)
	}
}

func TestErrorIs(t *testing.T) {
	e := &cuda.Error{Code: 218, Name: "CUDA_ERROR_INVALID_PTX", Op: "cuModuleLoadDataEx", Detail: "JIT log:\nline 3: syntax error"}
	wrapped := fmt.Errorf("loading kernels: %w", e)
	mustIs(t, wrapped, cuda.ErrInvalidPTX)
	if errors.Is(wrapped, cuda.ErrInvalidImage) {
		t.Error("INVALID_PTX matched INVALID_IMAGE")
	}
	var ce *cuda.Error
	if !errors.As(wrapped, &ce) || ce.Op != "cuModuleLoadDataEx" {
		t.Errorf("errors.As lost the op: %+v", ce)
	}
	msg := e.Error()
	for _, want := range []string{"cuModuleLoadDataEx", "CUDA_ERROR_INVALID_PTX", "syntax error"} {
		if !strings.Contains(msg, want) {
			t.Errorf("%q does not mention %q", msg, want)
		}
	}
	sentinels := []*cuda.Error{cuda.ErrInvalidValue, cuda.ErrNotSupported, cuda.ErrNotReady, cuda.ErrInvalidHandle,
		cuda.ErrIllegalAddress, cuda.ErrInvalidImage, cuda.ErrInvalidPTX, cuda.ErrPeerAccessUnsupported, cuda.ErrNoDevice}
	for _, s := range sentinels {
		if s.Name == "" || !strings.HasPrefix(s.Name, "CUDA_ERROR_") {
			t.Errorf("sentinel %d has name %q", s.Code, s.Name)
		}
	}
	if errors.Is(cuda.ErrNoDriver, cuda.ErrNoDevice) {
		t.Error("ErrNoDriver matched ErrNoDevice")
	}
}

func TestIPCHandleMarshal(t *testing.T) {
	var h cuda.IPCMemHandle
	for i := range h {
		h[i] = byte(i*7 + 1)
	}
	b, err := h.MarshalBinary()
	must(t, err)
	var h2 cuda.IPCMemHandle
	must(t, h2.UnmarshalBinary(b))
	if h2 != h {
		t.Fatal("binary round trip changed the handle")
	}
	b[0] ^= 0xff // the marshaled bytes are a copy
	if h[0] == b[0] {
		t.Fatal("MarshalBinary aliases the handle")
	}
	j, err := json.Marshal(map[string]any{"mem": h})
	must(t, err)
	var back map[string]cuda.IPCMemHandle
	must(t, json.Unmarshal(j, &back))
	if back["mem"] != h {
		t.Fatalf("JSON round trip: %s", j)
	}
	if len(h.String()) != 128 {
		t.Fatalf("hex form %q", h.String())
	}
	mustIs(t, h2.UnmarshalBinary(make([]byte, 63)), cuda.ErrInvalidValue)
	mustIs(t, h2.UnmarshalBinary(make([]byte, 65)), cuda.ErrInvalidValue)
	mustIs(t, h2.UnmarshalText([]byte("zz")), cuda.ErrInvalidValue)
	mustIs(t, h2.UnmarshalText([]byte(strings.Repeat("g", 128))), cuda.ErrInvalidValue)

	var e cuda.IPCEventHandle
	e[63] = 9
	txt, err := e.MarshalText()
	must(t, err)
	var e2 cuda.IPCEventHandle
	must(t, e2.UnmarshalText(txt))
	if e2 != e {
		t.Fatal("event handle text round trip")
	}
	mustIs(t, e2.UnmarshalBinary(nil), cuda.ErrInvalidValue)
}

func TestMemOpValidate(t *testing.T) {
	good := []cuda.MemOp{
		cuda.WaitValue32Op(0x1004, 1, cuda.WaitEQ),
		cuda.WaitValue64Op(0x1008, 1<<40, cuda.WaitNOR|cuda.WaitFlush),
		cuda.WriteValue32Op(0x1004, 7, cuda.WriteDefault),
		cuda.WriteValue64Op(0x1000, 7, cuda.WriteDefault),
		cuda.FlushRemoteWritesOp(),
		cuda.BarrierOp(cuda.BarrierGPU),
	}
	for _, op := range good {
		must(t, op.Validate())
	}
	mustIs(t, cuda.WriteValue32Op(0x1004, 7, cuda.WriteNoMemoryBarrier).Validate(), cuda.ErrNotSupported)
	bad := map[string]cuda.MemOp{
		"nil address":        cuda.WriteValue64Op(0, 1, 0),
		"unaligned 64":       cuda.WaitValue64Op(0x1004, 1, cuda.WaitGEQ),
		"unaligned 32":       cuda.WriteValue32Op(0x1002, 1, 0),
		"32-bit overflow":    {Kind: cuda.MemOpWriteValue32, Addr: 0x1000, Value: 1 << 32},
		"unknown kind":       {Kind: 99, Addr: 0x1000},
		"zero kind":          {},
		"unknown wait flag":  {Kind: cuda.MemOpWaitValue64, Addr: 0x1000, Flags: 0x10},
		"unknown write flag": {Kind: cuda.MemOpWriteValue64, Addr: 0x1000, Flags: 0x2},
		"flush flags":        {Kind: cuda.MemOpFlushRemoteWrites, Flags: 1},
		"barrier scope":      {Kind: cuda.MemOpBarrier, Flags: 5},
	}
	for name, op := range bad {
		if err := op.Validate(); !errors.Is(err, cuda.ErrInvalidValue) {
			t.Errorf("%s: got %v, want ErrInvalidValue", name, err)
		}
	}
}

// TestArgumentValidation: arguments are checked before any driver call, and
// nil, zero-value or closed objects answer with errors. Nothing here needs a
// driver, and nothing may crash.
func TestArgumentValidation(t *testing.T) {
	var (
		nilStream  *cuda.Stream
		zeroStream = &cuda.Stream{}
		nilCtx     *cuda.Context
		zeroCtx    = &cuda.Context{}
		nilEvent   *cuda.Event
		nilGraph   *cuda.Graph
		nilExec    *cuda.GraphExec
		nilModule  *cuda.Module
		nilFunc    *cuda.Function
	)
	inval := cuda.ErrInvalidValue
	handle := cuda.ErrInvalidHandle

	// Bad arguments win over bad receivers: checked first, without the driver.
	for _, s := range []*cuda.Stream{nilStream, zeroStream} {
		mustIs(t, s.WriteValue64(0x1004, 1, 0), inval)
		mustIs(t, s.WaitValue64(0, 1, cuda.WaitGEQ), inval)
		mustIs(t, s.WriteValue32(0x1002, 1, 0), inval)
		mustIs(t, s.WaitValue32(0x1001, 1, cuda.WaitEQ), inval)
		mustIs(t, s.WaitValue64(0x1000, 1, 7), inval)
		mustIs(t, s.BatchMemOp(nil), inval)
		mustIs(t, s.BatchMemOp(make([]cuda.MemOp, cuda.MaxBatch+1)), inval)
		mustIs(t, s.BatchMemOp([]cuda.MemOp{cuda.WriteValue64Op(0x1000, 1, 0), {}}), inval)
		mustIs(t, s.Memcpy(0, 0x1000, 8), inval)
		mustIs(t, s.Memcpy(0x1000, 0x2000, 0), inval)
		mustIs(t, s.MemcpyHtoD(0x1000, 0x2000, -1), inval)
		mustIs(t, s.MemcpyDtoH(0x1000, 0, 8), inval)
		mustIs(t, s.MemcpyDtoD(0, 0x2000, 8), inval)
		mustIs(t, s.MemcpyPeer(0x1000, nil, 0x2000, nil, 0), inval)
		mustIs(t, s.MemsetD8(0, 1, 8), inval)
		mustIs(t, s.MemsetD32(0x1002, 1, 8), inval)
		mustIs(t, s.MemsetD32(0x1000, 1, 0), inval)
		mustIs(t, s.LaunchHostFunc(nil), inval)
		mustIs(t, s.LaunchKernel(nilFunc, cuda.LaunchConfig{}), inval)
		mustIs(t, s.LaunchKernel(nilFunc, cuda.Linear(1, 1), "a string"), inval)
		mustIs(t, s.LaunchKernel(nilFunc, cuda.Linear(1, 1), &struct{}{}), inval)
		mustIs(t, s.LaunchKernel(nilFunc, cuda.Linear(1, 1), nil), inval)
		mustIs(t, s.BeginCapture(9), inval)

		// Valid arguments on a nil or never-created stream.
		mustIs(t, s.WriteValue64(0x1000, 1, 0), handle)
		mustIs(t, s.WaitValue32(0x1000, 1, cuda.WaitGEQ), handle)
		mustIs(t, s.BatchMemOp([]cuda.MemOp{cuda.WriteValue64Op(0x1000, 1, 0)}), handle)
		mustIs(t, s.Memcpy(0x1000, 0x2000, 8), handle)
		mustIs(t, s.Synchronize(), handle)
		_, err := s.Query()
		mustIs(t, err, handle)
		mustIs(t, s.LaunchHostFunc(func() {}), handle)
		mustIs(t, s.LaunchKernel(nilFunc, cuda.Linear(1, 1), uint64(1)), handle)
		mustIs(t, s.WaitEvent(nilEvent), handle)
		mustIs(t, s.BeginCapture(cuda.CaptureRelaxed), handle)
		_, err = s.EndCapture()
		mustIs(t, err, handle)
		_, err = s.CaptureInfo()
		mustIs(t, err, handle)
		mustIs(t, s.Close(), handle)
		if s.Handle() != 0 {
			t.Error("nil stream has a handle")
		}
	}

	for _, c := range []*cuda.Context{nilCtx, zeroCtx} {
		_, err := c.NewStream(cuda.StreamNonBlocking, 0)
		mustIs(t, err, handle)
		_, err = c.NewEvent(0)
		mustIs(t, err, handle)
		_, err = c.MemAlloc(8)
		mustIs(t, err, handle)
		_, err = c.MemHostAlloc(8, 0)
		mustIs(t, err, handle)
		_, err = c.NewGraph()
		mustIs(t, err, handle)
		_, err = c.LoadModule([]byte("x"))
		mustIs(t, err, handle)
		_, err = c.IPCMemHandle(0x1000)
		mustIs(t, err, handle)
		mustIs(t, c.SetCurrent(), handle)
		mustIs(t, c.Close(), handle)
	}
	_, err := nilCtx.IPCMemHandle(0)
	mustIs(t, err, inval)
	_, err = nilCtx.OpenIPCMemHandle(cuda.IPCMemHandle{}, 0x8)
	mustIs(t, err, inval)
	_, err = cuda.EventFromHandle(nilCtx, 1)
	mustIs(t, err, handle)

	mustIs(t, nilEvent.Record(nilStream), handle)
	mustIs(t, (&cuda.Event{}).Synchronize(), handle)
	_, err = nilEvent.Query()
	mustIs(t, err, handle)
	_, err = cuda.ElapsedTime(nilEvent, nilEvent)
	mustIs(t, err, handle)
	mustIs(t, nilEvent.Close(), handle)
	_, err = nilEvent.IPCHandle()
	mustIs(t, err, handle)

	_, err = nilGraph.AddBatchMemOpNode(nil, nil)
	mustIs(t, err, inval)
	_, err = nilGraph.AddBatchMemOpNode([]cuda.Node{{}}, []cuda.MemOp{cuda.WriteValue64Op(0x1000, 1, 0)})
	mustIs(t, err, inval) // a nil dependency
	_, err = nilGraph.AddBatchMemOpNode(nil, []cuda.MemOp{cuda.WriteValue64Op(0x1000, 1, 0)})
	mustIs(t, err, handle)
	_, err = nilGraph.AddHostNode(nil, nil)
	mustIs(t, err, inval)
	_, err = nilGraph.AddMemsetNode(nil, 0x1000, 1, 3, 8)
	mustIs(t, err, inval)
	_, err = nilGraph.AddMemsetNode(nil, 0x1000, 256, 1, 8)
	mustIs(t, err, inval)
	_, err = nilGraph.AddMemcpyNode(nil, 0x1000, 0x2000, 0)
	mustIs(t, err, inval)
	mustIs(t, nilGraph.AddDependencies([]cuda.Node{}, nil), inval)
	_, err = nilGraph.AddEmptyNode(nil)
	mustIs(t, err, handle)
	_, err = nilGraph.Instantiate(0)
	mustIs(t, err, handle)
	_, err = nilGraph.Instantiate(2) // UPLOAD: only cuGraphInstantiateWithParams takes it
	mustIs(t, err, inval)
	mustIs(t, nilGraph.Close(), handle)
	mustIs(t, nilExec.Launch(nilStream), handle)
	mustIs(t, nilExec.SetBatchMemOpNodeParams(cuda.Node{}, nil), inval)
	mustIs(t, nilExec.Close(), handle)

	_, err = nilModule.Function("k")
	mustIs(t, err, handle)
	_, err = nilModule.Function("")
	mustIs(t, err, inval)
	mustIs(t, nilModule.Close(), handle)
	mustIs(t, (&cuda.DeviceMemory{}).Close(), handle)
	mustIs(t, (&cuda.HostMemory{}).Close(), handle)
	mustIs(t, (&cuda.IPCMapping{}).Close(), handle)
	mustIs(t, (&cuda.HostRegistration{}).Close(), handle)
}

// TestSymbolsDocumented keeps SYMBOLS.md in step with cu_syms.h.
func TestSymbolsDocumented(t *testing.T) {
	doc, err := os.ReadFile("SYMBOLS.md")
	must(t, err)
	text := string(doc)
	syms := cuda.Symbols()
	if len(syms) < 60 {
		t.Fatalf("only %d symbols", len(syms))
	}
	for _, s := range syms {
		row := fmt.Sprintf("| `%s` | `%s` |", s.API, s.Name)
		if !strings.Contains(text, row) {
			t.Errorf("SYMBOLS.md lacks the row %q", row)
		}
	}
	if rows := strings.Count(text, "\n| `cu"); rows != len(syms) {
		t.Errorf("SYMBOLS.md has %d entry rows, cu_syms.h %d symbols", rows, len(syms))
	}
}
