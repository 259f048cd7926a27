package streamcore

// DeviceIPC is implemented by backends whose device memory other processes of the
// host can map (the CUDA backend, through CUDA IPC). Test for it with a type
// assertion on a Backend. ucp uses it, through ucp.ContextParams.Device, to export
// device regions to same-host peers and to move device RMA as copy-engine copies into
// their mapped memory.
//
// The handle calls are driver calls that may wait for the device: callers make them on
// the user's goroutine (packing and unpacking keys), never from the engine's rounds.
type DeviceIPC interface {
	Backend
	// DeviceUUID is the UUID of the backend's device (cuDeviceGetUuid).
	DeviceUUID() ([16]byte, error)
	// CanAccessPeer reports whether this device can read and write the memory of the
	// device with that UUID: the same device, or one with peer access.
	CanAccessPeer(uuid [16]byte) bool
	// IPCAllocation describes the allocation containing ptr (cuPointerGetAttributes).
	IPCAllocation(ptr uintptr) (IPCAllocation, error)
	// IPCGetMemHandle exports the allocation at base (cuIpcGetMemHandle).
	IPCGetMemHandle(base uintptr) (IPCHandle, error)
	// IPCOpenMemHandle maps another process's allocation and returns its address here
	// (cuIpcOpenMemHandle with CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS).
	IPCOpenMemHandle(h IPCHandle) (uintptr, error)
	// IPCCloseMemHandle unmaps what IPCOpenMemHandle mapped (cuIpcCloseMemHandle).
	IPCCloseMemHandle(mapped uintptr) error
	// CopyDevice copies n bytes between two device addresses (this process's device
	// memory or mappings of a peer's) in stream order. sameDevice says both are memory
	// of the backend's own device (its own or a same-device peer's mapping): the
	// backend may then copy with a kernel where a launch costs less than the copy
	// engine's cuMemcpyDtoDAsync (which skips the look-up of both sides that
	// Stream.Copy's cuMemcpyAsync makes).
	CopyDevice(s Stream, dst, src uintptr, n int, sameDevice bool) error
	// CopyDeviceUncaptured is CopyDevice on a stream that is not capturing; on one that
	// is (Stream.Capturing) it enqueues nothing and reports captured. One driver call
	// for both, where Capturing then CopyDevice make two: the copy of a put is issued
	// as often as the hardware drains it.
	CopyDeviceUncaptured(s Stream, dst, src uintptr, n int, sameDevice bool) (captured bool, err error)
	// WriteValueAt stores value into the 8-byte aligned device word at addr (this
	// process's device memory or a mapping of a peer's) once all earlier work on s is
	// done (cuStreamWriteValue64): the flag of the same-host device path.
	WriteValueAt(s Stream, addr uintptr, value uint64) error
	// WaitValueAt holds back later work on s until cmp(word at addr, value) holds
	// (cuStreamWaitValue64).
	WaitValueAt(s Stream, addr uintptr, value uint64, cmp Compare) error
	// AllocSharedWords allocates n zeroed words in a shared memory segment that
	// other processes of the host map with MapSharedWords, mapped for this device
	// (cuMemHostRegister with DEVICEMAP): a peer's streams write them (WriteValueAt
	// after a copy into this process's memory) while this process's CPU, streams and
	// kernels read them, and the CPU can always store into them, so no wait on them
	// outlives a peer that died. Freeing the block unmaps it here.
	AllocSharedWords(n int) (*WordBlock, SharedWords, error)
	// MapSharedWords maps the words process pid shared (what AllocSharedWords
	// returned there) and returns the address of its first word here for this
	// process's CPU (host) and for the device (dev, for WriteValueAt). unmap releases
	// the mapping; nothing may still write through it.
	MapSharedWords(pid int, w SharedWords) (host, dev uintptr, unmap func() error, err error)
}

// SharedWords names the segment of an AllocSharedWords block for the processes that
// map it (the owner's pid travels separately, from the authenticated handshake).
type SharedWords struct {
	FD   int // the segment's file descriptor in the owning process
	Size int // its bytes (whole pages)
}

// IPCHandleSize is the size of a CUDA IPC memory handle (CU_IPC_HANDLE_SIZE).
const IPCHandleSize = 64

// IPCHandle is a CUipcMemHandle: it names a device allocation for another process.
type IPCHandle [IPCHandleSize]byte

// IPCAllocation is the device allocation containing an address, as the driver sees it.
type IPCAllocation struct {
	Base     uint64 // CU_POINTER_ATTRIBUTE_RANGE_START_ADDR
	Size     uint64 // CU_POINTER_ATTRIBUTE_RANGE_SIZE
	BufferID uint64 // CU_POINTER_ATTRIBUTE_BUFFER_ID
	// LegacyIPC: CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE (false for VMM memory).
	LegacyIPC bool
}

// Same reports whether b is the allocation a names: same base, size and buffer id
// (CUDA never reuses a buffer id). LegacyIPC, not on the wire, is not compared.
func (a IPCAllocation) Same(b IPCAllocation) bool {
	return a.Base == b.Base && a.Size == b.Size && a.BufferID == b.BufferID
}
