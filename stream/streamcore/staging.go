package streamcore

// HostStaging is implemented by backends whose memory the CPU cannot always touch
// directly (the CUDA backend): it tells device memory from host memory and allocates
// the page-locked host memory device buffers are staged through. Test for it with a
// type assertion on a Backend; host backends do not implement it (every buffer is
// host memory there and nothing is staged).
//
// Its methods are driver calls that may wait for other work of the device (see
// docs/ARCHITECTURE.md, "Driver calls the engine may make"): call them on the user's
// goroutine, never from the engine's rounds.
type HostStaging interface {
	// Locate reports where addr lives: device memory (device true), managed memory
	// (managed true; device may be true too, and managed wins), or host memory (both
	// false). An address the driver does not know is ordinary pageable host memory:
	// both false and no error. Other errors are the driver's.
	Locate(addr uintptr) (device, managed bool, err error)
	// AllocPinned allocates n bytes of page-locked host memory usable from every
	// context of the process (on CUDA cuMemHostAlloc with PORTABLE). The caller owns
	// it and frees it with Close.
	AllocPinned(n int) (Pinned, error)
}

// Pinned is page-locked host memory from HostStaging.AllocPinned. Its memory is C
// memory, so C code, UCX and the GPU's copy engine may hold its address.
type Pinned interface {
	// Bytes views the memory as a byte slice, valid until Close.
	Bytes() []byte
	// Addr is the address of the memory.
	Addr() uintptr
	// Size is the size in bytes.
	Size() int
	// Close frees the memory; a second Close returns an error.
	Close() error
}
