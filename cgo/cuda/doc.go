// Package cuda is ucpx's binding of the CUDA driver API, loaded at run time.
//
// # Loading
//
// Nothing here links libcuda or includes a CUDA header. Load dlopens
// libcuda.so.1, resolves the entry points ucpx uses by their versioned symbols
// (cuStreamWaitValue64_v2, cuStreamBatchMemOp_v2, cuMemAlloc_v2, ... — the
// mapping is in SYMBOLS.md beside this file) and calls cuInit(0). It runs once,
// on first use, never at init. Where there is no usable driver it returns an
// error matching ErrNoDriver and every host-side feature of ucpx keeps working:
//
//	if err := cuda.Load(); errors.Is(err, cuda.ErrNoDriver) {
//		// no GPU here: use host streams
//	}
//
// Before cuInit, Load sets CUDA_DEVICE_MAX_CONNECTIONS to 32 (ConnectionsEnv,
// DefaultConnections) unless the environment sets it: CUDA maps a context's streams
// onto that many hardware queues (8 by default), streams sharing a queue run in
// submission order, and a memop wait that only another stream's later work answers
// then never returns. Set it yourself to keep another value; where another library
// initialized CUDA in the process first, its setting stays.
//
// The types the driver API takes (the CUstreamBatchMemOpParams union, graph
// node parameter structs, ...) are declared in cu_types.h from the driver API
// documentation; TestABIAgainstHeader checks them, and every entry point's
// prototype, against a real cuda.h when one is available.
//
// # Layers
//
// The raw layer is C: a table of function pointers filled by dlsym and one small
// helper per entry point (shim.c). The Go layer wraps handles in small types —
// Context, Stream, Event, DeviceMemory, HostMemory, Graph, GraphExec, Module,
// Function, IPCMapping — whose methods take and return Go types only. Raw
// handles cross as uintptr (Stream.Handle, StreamFromHandle, ...) so that
// other CUDA bindings can interoperate. Objects made from a raw handle borrow
// it: their Close does not destroy it.
//
// # Contexts and goroutines
//
// CUDA's current context is per OS thread, and a goroutine may change OS
// thread between any two calls. ucpx does not rely on it: every helper receives
// the Context its object belongs to and makes it current inside the same C call
// if it is not already (one cuCtxGetCurrent when it is, the steady state). A
// context the helper displaced is restored before returning, so code that
// bound its own context on a locked thread keeps it. Callers therefore need no
// runtime.LockOSThread; Context.SetCurrent is there only for mixing ucpx with
// other CUDA code on a locked thread.
//
// # Errors
//
// A failed driver call returns an *Error carrying the CUresult, its CUDA name
// and the entry point. *Error matches any sentinel with the same code, so
// errors.Is(err, cuda.ErrNotReady) works regardless of the operation. Argument
// checks made before any driver call (nil or unaligned addresses, zero sizes,
// batches over MaxBatch) return errors matching ErrInvalidValue; use of an
// object after Close (a second Close too) returns one matching ErrInvalidHandle
// and the "closed" root every ucpx package shares (ucp.ErrClosed,
// graph.ErrClosed). Nothing in this package panics on bad input or crashes on a
// closed object.
//
// # Lifetimes
//
// Every object has Close; a second Close returns an error. Close a Context last:
// objects made from it run their driver calls in it. No Go pointer is kept by C
// beyond a call: arguments are copied into C memory or the driver copies them
// (memop batches, kernel arguments, graph node parameters), and memory the GPU
// keeps using (signal words, staging buffers) comes from cuMemHostAlloc or
// cuMemAlloc.
//
// # Host callbacks
//
// Stream.LaunchHostFunc and Graph.AddHostNode run Go functions from the driver's
// callback thread through an exported trampoline and a cgo.Handle; see
// hostfunc.go for the cost (about a microsecond per callback above the
// driver's own latency) and lifetime rules. Callbacks must not call CUDA.
package cuda
