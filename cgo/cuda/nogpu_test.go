package cuda_test

// Tests that need no GPU: they run (not skip) on every machine.

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/cgo/cuda"
	"github.com/ucpx/ucpx/internal/errs"
	"github.com/ucpx/ucpx/internal/testenv"
)

func TestLoadMissingLibrary(t *testing.T) {
	err := cuda.LoadLibrary("libcuda-ucpx-test-does-not-exist.so.1")
	require.ErrorIs(t, err, cuda.ErrNoDriver)
	require.ErrorIs(t, err, cuda.ErrNoLibrary)
	assert.Contains(t, err.Error(), "libcuda-ucpx-test-does-not-exist.so.1", "error does not name the library")
	// The GPU tests' skip rule reads a missing library as "no GPU here".
	assert.True(t, testenv.NoGPU(err), "testenv.NoGPU(%v)", err)
}

func TestLoadLibraryWithoutSymbols(t *testing.T) {
	// A real shared library that is not a CUDA driver: Load must refuse it
	// cleanly (ErrNoDriver) and leave the function table untouched.
	err := cuda.LoadLibrary("libc.so.6")
	require.ErrorIs(t, err, cuda.ErrNoDriver)
	assert.NotErrorIs(t, err, cuda.ErrNoLibrary, "libc was found, the error should be about symbols")
	assert.Contains(t, err.Error(), "cuInit", "error does not name the missing symbol")
	// A library that opens but is not a usable driver fails the GPU tests, not skips them.
	assert.False(t, testenv.NoGPU(err), "testenv.NoGPU(%v)", err)
}

func TestNoDriverEverywhere(t *testing.T) {
	err := cuda.Load()
	if err == nil {
		t.Skip("a CUDA driver is present")
	}
	require.ErrorIs(t, err, cuda.ErrNoDriver)
	assert.Same(t, err, cuda.Load(), "Load is not cached")
	_, err = cuda.DeviceCount()
	require.ErrorIs(t, err, cuda.ErrNoDriver)
	_, err = cuda.GetDevice(0)
	require.ErrorIs(t, err, cuda.ErrNoDriver)
	_, err = cuda.DriverVersion()
	require.ErrorIs(t, err, cuda.ErrNoDriver)
	_, err = cuda.StreamFromHandle(1)
	require.ErrorIs(t, err, cuda.ErrNoDriver)
	_, err = cuda.ContextFromHandle(1)
	require.ErrorIs(t, err, cuda.ErrNoDriver)
	_, err = cuda.CurrentContext()
	require.ErrorIs(t, err, cuda.ErrNoDriver)
	require.ErrorIs(t, cuda.ClearCurrent(), cuda.ErrNoDriver)
	// A Device value made without the driver answers with an error, not a crash.
	_, err = cuda.Device{}.Name()
	require.ErrorIs(t, err, cuda.ErrNotSupported)
	_, err = cuda.Device{}.RetainPrimaryContext()
	require.ErrorIs(t, err, cuda.ErrNoDriver)
	for _, s := range cuda.Symbols() {
		assert.False(t, s.Loaded, "%s reported loaded without a driver", s.Name)
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
		assert.Equal(t, name, code.String(), "Result(%d)", code)
	}
	assert.Equal(t, "CUDA_ERROR(123456)", cuda.Result(123456).String(), "an unknown code")
}

func TestErrorIs(t *testing.T) {
	e := &cuda.Error{Code: 218, Name: "CUDA_ERROR_INVALID_PTX", Op: "cuModuleLoadDataEx", Detail: "JIT log:\nline 3: syntax error"}
	wrapped := fmt.Errorf("loading kernels: %w", e)
	require.ErrorIs(t, wrapped, cuda.ErrInvalidPTX)
	assert.NotErrorIs(t, wrapped, cuda.ErrInvalidImage, "INVALID_PTX matched INVALID_IMAGE")
	var ce *cuda.Error
	if assert.ErrorAs(t, wrapped, &ce) {
		assert.Equal(t, "cuModuleLoadDataEx", ce.Op, "errors.As lost the op")
	}
	msg := e.Error()
	for _, want := range []string{"cuModuleLoadDataEx", "CUDA_ERROR_INVALID_PTX", "syntax error"} {
		assert.Contains(t, msg, want)
	}
	sentinels := []*cuda.Error{cuda.ErrInvalidValue, cuda.ErrNotSupported, cuda.ErrNotReady, cuda.ErrInvalidHandle,
		cuda.ErrIllegalAddress, cuda.ErrInvalidImage, cuda.ErrInvalidPTX, cuda.ErrPeerAccessUnsupported, cuda.ErrNoDevice}
	for _, s := range sentinels {
		assert.Truef(t, strings.HasPrefix(s.Name, "CUDA_ERROR_"), "sentinel %d has name %q", s.Code, s.Name)
	}
	assert.NotErrorIs(t, cuda.ErrNoDriver, cuda.ErrNoDevice)
}

// The use of an object after Close, a second Close among it, matches the "closed" root
// every ucpx package shares (ucp.ErrClosed, graph.ErrClosed, ...) as well as
// ErrInvalidHandle; a CUDA_ERROR_INVALID_HANDLE from the driver does not claim a Close.
// Before, a second Close of a wrapper (graph.AdoptCUDA's too) matched only
// ErrInvalidHandle. Nil objects answer as closed ones do, with no driver.
func TestClosedObjectsMatchErrClosed(t *testing.T) {
	for name, close := range map[string]func() error{
		"Context":          (*cuda.Context)(nil).Close,
		"Event":            (*cuda.Event)(nil).Close,
		"Graph":            (*cuda.Graph)(nil).Close,
		"GraphExec":        (*cuda.GraphExec)(nil).Close,
		"IPCMapping":       (*cuda.IPCMapping)(nil).Close,
		"DeviceMemory":     (*cuda.DeviceMemory)(nil).Close,
		"HostMemory":       (*cuda.HostMemory)(nil).Close,
		"HostRegistration": (*cuda.HostRegistration)(nil).Close,
		"Module":           (*cuda.Module)(nil).Close,
		"Stream":           (*cuda.Stream)(nil).Close,
	} {
		err := close()
		require.ErrorIs(t, err, errs.Closed, "%s", name)
		require.ErrorIs(t, err, cuda.ErrInvalidHandle, "%s", name)
		require.NotErrorIs(t, err, errs.InvalidParam, "%s", name)
	}
	_, err := (*cuda.Graph)(nil).AddEmptyNode(nil)
	require.ErrorIs(t, err, errs.Closed)
	require.ErrorIs(t, (*cuda.GraphExec)(nil).Launch(nil), errs.Closed)
	driver := &cuda.Error{Code: cuda.ErrInvalidHandle.Code, Name: cuda.ErrInvalidHandle.Name, Op: "cuGraphLaunch"}
	require.ErrorIs(t, driver, cuda.ErrInvalidHandle)
	require.NotErrorIs(t, driver, errs.Closed, "the driver's INVALID_HANDLE claimed a Close")
	require.NotErrorIs(t, cuda.ErrInvalidHandle, errs.Closed)
}

func TestIPCHandleMarshal(t *testing.T) {
	var h cuda.IPCMemHandle
	for i := range h {
		h[i] = byte(i*7 + 1)
	}
	b, err := h.MarshalBinary()
	require.NoError(t, err)
	var h2 cuda.IPCMemHandle
	require.NoError(t, h2.UnmarshalBinary(b))
	require.Equal(t, h, h2, "binary round trip changed the handle")
	b[0] ^= 0xff // the marshaled bytes are a copy
	require.NotEqual(t, h[0], b[0], "MarshalBinary aliases the handle")
	j, err := json.Marshal(map[string]any{"mem": h})
	require.NoError(t, err)
	var back map[string]cuda.IPCMemHandle
	require.NoError(t, json.Unmarshal(j, &back))
	require.Equal(t, h, back["mem"], "JSON round trip: %s", j)
	require.Len(t, h.String(), 128, "hex form")
	require.ErrorIs(t, h2.UnmarshalBinary(make([]byte, 63)), cuda.ErrInvalidValue)
	require.ErrorIs(t, h2.UnmarshalBinary(make([]byte, 65)), cuda.ErrInvalidValue)
	require.ErrorIs(t, h2.UnmarshalText([]byte("zz")), cuda.ErrInvalidValue)
	require.ErrorIs(t, h2.UnmarshalText([]byte(strings.Repeat("g", 128))), cuda.ErrInvalidValue)

	var e cuda.IPCEventHandle
	e[63] = 9
	txt, err := e.MarshalText()
	require.NoError(t, err)
	var e2 cuda.IPCEventHandle
	require.NoError(t, e2.UnmarshalText(txt))
	require.Equal(t, e, e2, "event handle text round trip")
	require.ErrorIs(t, e2.UnmarshalBinary(nil), cuda.ErrInvalidValue)
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
		require.NoError(t, op.Validate())
	}
	require.ErrorIs(t, cuda.WriteValue32Op(0x1004, 7, cuda.WriteNoMemoryBarrier).Validate(), cuda.ErrNotSupported)
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
		assert.ErrorIs(t, op.Validate(), cuda.ErrInvalidValue, name)
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
		require.ErrorIs(t, s.WriteValue64(0x1004, 1, 0), inval)
		require.ErrorIs(t, s.WaitValue64(0, 1, cuda.WaitGEQ), inval)
		require.ErrorIs(t, s.WriteValue32(0x1002, 1, 0), inval)
		require.ErrorIs(t, s.WaitValue32(0x1001, 1, cuda.WaitEQ), inval)
		require.ErrorIs(t, s.WaitValue64(0x1000, 1, 7), inval)
		require.ErrorIs(t, s.BatchMemOp(nil), inval)
		require.ErrorIs(t, s.BatchMemOp(make([]cuda.MemOp, cuda.MaxBatch+1)), inval)
		require.ErrorIs(t, s.BatchMemOp([]cuda.MemOp{cuda.WriteValue64Op(0x1000, 1, 0), {}}), inval)
		require.ErrorIs(t, s.Memcpy(0, 0x1000, 8), inval)
		require.ErrorIs(t, s.Memcpy(0x1000, 0x2000, 0), inval)
		require.ErrorIs(t, s.MemcpyHtoD(0x1000, 0x2000, -1), inval)
		require.ErrorIs(t, s.MemcpyDtoH(0x1000, 0, 8), inval)
		require.ErrorIs(t, s.MemcpyDtoD(0, 0x2000, 8), inval)
		require.ErrorIs(t, s.MemcpyPeer(0x1000, nil, 0x2000, nil, 0), inval)
		require.ErrorIs(t, s.MemsetD8(0, 1, 8), inval)
		require.ErrorIs(t, s.MemsetD32(0x1002, 1, 8), inval)
		require.ErrorIs(t, s.MemsetD32(0x1000, 1, 0), inval)
		require.ErrorIs(t, s.LaunchHostFunc(nil), inval)
		require.ErrorIs(t, s.LaunchKernel(nilFunc, cuda.LaunchConfig{}), inval)
		require.ErrorIs(t, s.LaunchKernel(nilFunc, cuda.Linear(1, 1), "a string"), inval)
		require.ErrorIs(t, s.LaunchKernel(nilFunc, cuda.Linear(1, 1), &struct{}{}), inval)
		require.ErrorIs(t, s.LaunchKernel(nilFunc, cuda.Linear(1, 1), nil), inval)
		require.ErrorIs(t, s.BeginCapture(9), inval)

		// Valid arguments on a nil or never-created stream.
		require.ErrorIs(t, s.WriteValue64(0x1000, 1, 0), handle)
		require.ErrorIs(t, s.WaitValue32(0x1000, 1, cuda.WaitGEQ), handle)
		require.ErrorIs(t, s.BatchMemOp([]cuda.MemOp{cuda.WriteValue64Op(0x1000, 1, 0)}), handle)
		require.ErrorIs(t, s.Memcpy(0x1000, 0x2000, 8), handle)
		require.ErrorIs(t, s.Synchronize(), handle)
		_, err := s.Query()
		require.ErrorIs(t, err, handle)
		require.ErrorIs(t, s.LaunchHostFunc(func() {}), handle)
		require.ErrorIs(t, s.LaunchKernel(nilFunc, cuda.Linear(1, 1), uint64(1)), handle)
		require.ErrorIs(t, s.WaitEvent(nilEvent), handle)
		require.ErrorIs(t, s.BeginCapture(cuda.CaptureRelaxed), handle)
		_, err = s.EndCapture()
		require.ErrorIs(t, err, handle)
		_, err = s.CaptureInfo()
		require.ErrorIs(t, err, handle)
		require.ErrorIs(t, s.Close(), handle)
		assert.Zero(t, s.Handle(), "nil stream has a handle")
	}

	for _, c := range []*cuda.Context{nilCtx, zeroCtx} {
		_, err := c.NewStream(cuda.StreamNonBlocking, 0)
		require.ErrorIs(t, err, handle)
		_, err = c.NewEvent(0)
		require.ErrorIs(t, err, handle)
		_, err = c.MemAlloc(8)
		require.ErrorIs(t, err, handle)
		_, err = c.MemHostAlloc(8, 0)
		require.ErrorIs(t, err, handle)
		_, err = c.NewGraph()
		require.ErrorIs(t, err, handle)
		_, err = c.LoadModule([]byte("x"))
		require.ErrorIs(t, err, handle)
		_, err = c.IPCMemHandle(0x1000)
		require.ErrorIs(t, err, handle)
		require.ErrorIs(t, c.SetCurrent(), handle)
		require.ErrorIs(t, c.Close(), handle)
	}
	_, err := nilCtx.IPCMemHandle(0)
	require.ErrorIs(t, err, inval)
	_, err = nilCtx.OpenIPCMemHandle(cuda.IPCMemHandle{}, 0x8)
	require.ErrorIs(t, err, inval)
	_, err = cuda.EventFromHandle(nilCtx, 1)
	require.ErrorIs(t, err, handle)

	require.ErrorIs(t, nilEvent.Record(nilStream), handle)
	require.ErrorIs(t, (&cuda.Event{}).Synchronize(), handle)
	_, err = nilEvent.Query()
	require.ErrorIs(t, err, handle)
	_, err = cuda.ElapsedTime(nilEvent, nilEvent)
	require.ErrorIs(t, err, handle)
	require.ErrorIs(t, nilEvent.Close(), handle)
	_, err = nilEvent.IPCHandle()
	require.ErrorIs(t, err, handle)

	_, err = nilGraph.AddBatchMemOpNode(nil, nil)
	require.ErrorIs(t, err, inval)
	_, err = nilGraph.AddBatchMemOpNode([]cuda.Node{{}}, []cuda.MemOp{cuda.WriteValue64Op(0x1000, 1, 0)})
	require.ErrorIs(t, err, inval) // a nil dependency
	_, err = nilGraph.AddBatchMemOpNode(nil, []cuda.MemOp{cuda.WriteValue64Op(0x1000, 1, 0)})
	require.ErrorIs(t, err, handle)
	_, err = nilGraph.AddHostNode(nil, nil)
	require.ErrorIs(t, err, inval)
	_, err = nilGraph.AddMemsetNode(nil, 0x1000, 1, 3, 8)
	require.ErrorIs(t, err, inval)
	_, err = nilGraph.AddMemsetNode(nil, 0x1000, 256, 1, 8)
	require.ErrorIs(t, err, inval)
	_, err = nilGraph.AddMemcpyNode(nil, 0x1000, 0x2000, 0)
	require.ErrorIs(t, err, inval)
	require.ErrorIs(t, nilGraph.AddDependencies([]cuda.Node{}, nil), inval)
	_, err = nilGraph.AddEmptyNode(nil)
	require.ErrorIs(t, err, handle)
	_, err = nilGraph.Instantiate(0)
	require.ErrorIs(t, err, handle)
	_, err = nilGraph.Instantiate(2) // UPLOAD: only cuGraphInstantiateWithParams takes it
	require.ErrorIs(t, err, inval)
	require.ErrorIs(t, nilGraph.Close(), handle)
	require.ErrorIs(t, nilExec.Launch(nilStream), handle)
	require.ErrorIs(t, nilExec.SetBatchMemOpNodeParams(cuda.Node{}, nil), inval)
	require.ErrorIs(t, nilExec.Close(), handle)

	_, err = nilModule.Function("k")
	require.ErrorIs(t, err, handle)
	_, err = nilModule.Function("")
	require.ErrorIs(t, err, inval)
	require.ErrorIs(t, nilModule.Close(), handle)
	require.ErrorIs(t, (&cuda.DeviceMemory{}).Close(), handle)
	require.ErrorIs(t, (&cuda.HostMemory{}).Close(), handle)
	require.ErrorIs(t, (&cuda.IPCMapping{}).Close(), handle)
	require.ErrorIs(t, (&cuda.HostRegistration{}).Close(), handle)
}

// TestSymbolsDocumented keeps SYMBOLS.md in step with cu_syms.h.
func TestSymbolsDocumented(t *testing.T) {
	doc, err := os.ReadFile("SYMBOLS.md")
	require.NoError(t, err)
	text := string(doc)
	syms := cuda.Symbols()
	require.GreaterOrEqual(t, len(syms), 60, "symbols")
	for _, s := range syms {
		row := fmt.Sprintf("| `%s` | `%s` |", s.API, s.Name)
		assert.Contains(t, text, row, "SYMBOLS.md lacks the row")
	}
	assert.Equal(t, len(syms), strings.Count(text, "\n| `cu"), "SYMBOLS.md's entry rows, one per symbol of cu_syms.h")
}
