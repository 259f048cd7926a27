package protocol

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"

	"github.com/ucpx/ucpx/internal/errs"
	"github.com/ucpx/ucpx/stream/streamcore"
)

// CUDA-IPC handle cache: the part of the same-host device path (issue 14) that
// names device allocations across processes. The exporter sends a handle once per
// allocation and peer, with the first operation that needs it; the importer opens it
// once and keeps the mapping. Neither side ever waits for the other: a miss on one side
// is resolved from the message the operation carries, never by a collective step.
//
// Allocations are told apart by (base, size, buffer id): CUDA gives every allocation a
// buffer id unique in the process's lifetime (CU_POINTER_ATTRIBUTE_BUFFER_ID), so a
// buffer freed and reallocated at the same address, even with the same size, is a new
// key; the exporter exports it again, and the importer, seeing a new buffer id at a base
// it has mapped, opens the new one and retires the old mapping, which stays open until
// the keys that hold its address are released.
//
// An export Describe made (for a registered region, whose keys carry the handle) is
// held until its Forget, and goes with the last one. One only Export made stays until
// Forget, or until another allocation is exported at its base: nothing tells the
// exporter an allocation was freed (CUDA has no callback for cuMemFree), so every
// export is checked against the allocation's buffer id when it is used again and a
// stale one is never handed out, but a user of Export keeps the cache bounded only by
// forgetting what it frees. Package ucp uses Describe alone.
//
// Only legacy-IPC memory can be exported with cuIpcGetMemHandle: cuMemAlloc memory
// (and cuMemAllocAsync from pools without an IPC handle type set). Virtual memory
// management allocations (cuMemCreate/cuMemMap) are not legacy-IPC capable
// (CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE is 0): exporting them fails with
// ErrUnsupported, and the operation takes the staging path instead (StageNever then
// fails). Such memory would travel as a POSIX file descriptor
// (cuMemExportToShareableHandle with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, passed
// over a Unix socket), which is not built.

// IPCHandleSize is the size of a CUDA IPC memory handle (CU_IPC_HANDLE_SIZE).
const IPCHandleSize = streamcore.IPCHandleSize

// IPCHandle is a CUipcMemHandle: it names a device allocation for another process.
type IPCHandle = streamcore.IPCHandle

// IPCAllocation is the device allocation containing an address, as the driver sees it.
type IPCAllocation = streamcore.IPCAllocation

// IPCDriver is what the handle cache needs of a CUDA driver: the CUDA stream
// backend (streamcore.DeviceIPC) in production, a fake in tests. Its calls are made on
// the goroutine of the operation's call (the user's), never from the engine's rounds:
// cuIpcOpenMemHandle and cuIpcCloseMemHandle may wait for the device.
type IPCDriver interface {
	// IPCAllocation describes the allocation containing ptr (cuPointerGetAttributes):
	// this process's memory, or a mapping IPCOpenMemHandle made, whose Base and Size
	// the importer holds a peer's claims to (LegacyIPC and BufferID unused there).
	IPCAllocation(ptr uintptr) (IPCAllocation, error)
	// IPCGetMemHandle exports the allocation at base (cuIpcGetMemHandle).
	IPCGetMemHandle(base uintptr) (IPCHandle, error)
	// IPCOpenMemHandle maps another process's allocation (cuIpcOpenMemHandle_v2 with
	// CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) and returns its address here.
	IPCOpenMemHandle(h IPCHandle) (uintptr, error)
	// IPCCloseMemHandle unmaps what IPCOpenMemHandle mapped (cuIpcCloseMemHandle).
	IPCCloseMemHandle(mapped uintptr) error
}

// IPCPeer names a peer process for the cache (package ucp gives each endpoint's
// authenticated peer one).
type IPCPeer uint64

// ---- the wire ----

// IPC message kinds.
const (
	// IPCExport carries an allocation's handle: the importer opens it (once).
	IPCExport uint8 = 1
	// IPCInvalidate tells the importer the allocation is gone (freed, MemH closed):
	// it stops resolving, and is unmapped once no reference holds it.
	IPCInvalidate uint8 = 2
)

const (
	ipcVersion       = 1
	ipcInvalidateLen = 2 + 3*8
	ipcExportLen     = ipcInvalidateLen + IPCHandleSize
)

// IPCMessage is what an exporter sends an importer about one allocation. It travels
// inside ucpx's sealed envelopes (the peer is authenticated); its decoder still treats
// the bytes as hostile.
type IPCMessage struct {
	Kind  uint8
	Alloc IPCAllocation // LegacyIPC is not sent (only capable memory is exported)
	// Handle: IPCExport only.
	Handle IPCHandle
}

// AppendBinary appends the message's encoding: version, kind, then base, size and
// buffer id (little-endian), then the handle for IPCExport.
func (m IPCMessage) AppendBinary(b []byte) ([]byte, error) {
	if err := checkAlloc(m.Alloc); err != nil {
		return b, err
	}
	switch m.Kind {
	case IPCExport, IPCInvalidate:
	default:
		return b, fmt.Errorf("IPC message kind %d: %w", m.Kind, ErrInvalidParam)
	}
	b = append(b, ipcVersion, m.Kind)
	b = binary.LittleEndian.AppendUint64(b, m.Alloc.Base)
	b = binary.LittleEndian.AppendUint64(b, m.Alloc.Size)
	b = binary.LittleEndian.AppendUint64(b, m.Alloc.BufferID)
	if m.Kind == IPCExport {
		b = append(b, m.Handle[:]...)
	}
	return b, nil
}

func checkAlloc(a IPCAllocation) error {
	switch {
	case a.Base == 0 || a.Size == 0:
		return fmt.Errorf("IPC allocation at %#x of %d bytes: empty: %w", a.Base, a.Size, ErrInvalidParam)
	case a.Base+a.Size < a.Base:
		return fmt.Errorf("IPC allocation at %#x of %d bytes wraps the address space: %w", a.Base, a.Size, ErrInvalidParam)
	}
	return nil
}

// ErrBadIPCMessage: bytes that are not an IPC message of this version.
var ErrBadIPCMessage = errs.New("bad IPC message", errs.InvalidParam)

// DecodeIPCMessage decodes exactly one message from b. It reads only len(b) bytes,
// allocates nothing, and fails with ErrBadIPCMessage (matching ErrInvalidParam) for
// anything that is not a well-formed message of a known version and kind.
func DecodeIPCMessage(b []byte) (IPCMessage, error) {
	var m IPCMessage
	if len(b) < 2 {
		return m, fmt.Errorf("%d bytes: %w", len(b), ErrBadIPCMessage)
	}
	if b[0] != ipcVersion {
		return m, fmt.Errorf("version %d: %w", b[0], ErrBadIPCMessage)
	}
	m.Kind = b[1]
	want := 0
	switch m.Kind {
	case IPCExport:
		want = ipcExportLen
	case IPCInvalidate:
		want = ipcInvalidateLen
	default:
		return IPCMessage{}, fmt.Errorf("kind %d: %w", m.Kind, ErrBadIPCMessage)
	}
	if len(b) != want {
		return IPCMessage{}, fmt.Errorf("kind %d in %d bytes, want %d: %w", m.Kind, len(b), want, ErrBadIPCMessage)
	}
	m.Alloc.Base = binary.LittleEndian.Uint64(b[2:])
	m.Alloc.Size = binary.LittleEndian.Uint64(b[10:])
	m.Alloc.BufferID = binary.LittleEndian.Uint64(b[18:])
	if err := checkAlloc(m.Alloc); err != nil {
		return IPCMessage{}, fmt.Errorf("%v: %w", err, ErrBadIPCMessage)
	}
	if m.Kind == IPCExport {
		copy(m.Handle[:], b[ipcInvalidateLen:])
	}
	return m, nil
}

// ---- export side ----

// IPCExporter exports this process's device allocations, each once, and remembers
// which peers have its handle.
type IPCExporter struct {
	drv IPCDriver
	mu  sync.Mutex
	// byBase: the allocation exported at each base; a new buffer id there replaces it.
	byBase map[uint64]*ipcExport
}

type ipcExport struct {
	alloc  IPCAllocation
	handle IPCHandle
	sent   map[IPCPeer]struct{}
	// holds: Describes not yet given back with Forget (the regions whose keys carry
	// the handle); the export goes with the last.
	holds int
}

// NewIPCExporter makes the export side of the cache over drv.
func NewIPCExporter(drv IPCDriver) *IPCExporter {
	return &IPCExporter{drv: drv, byBase: map[uint64]*ipcExport{}}
}

// IPCRef names a device address for a peer: the allocation and the offset in it.
type IPCRef struct {
	Alloc  IPCAllocation
	Offset uint64
}

// Export prepares an operation on n bytes of device memory at ptr for peer: the
// reference the operation carries, and, when peer does not have this allocation's
// handle yet, the IPCExport message to send with it (then counted as sent). The
// handle is made once per allocation (cuIpcGetMemHandle); memory that is not
// legacy-IPC capable (VMM) fails with ErrUnsupported, a range running past its
// allocation with ErrInvalidParam.
func (e *IPCExporter) Export(peer IPCPeer, ptr uintptr, n int) (IPCRef, *IPCMessage, error) {
	if e == nil {
		return IPCRef{}, nil, fmt.Errorf("ipc export: nil exporter: %w", ErrInvalidParam)
	}
	ref, m, x, err := e.export(ptr, n, false)
	if err != nil {
		return IPCRef{}, nil, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, ok := x.sent[peer]; ok {
		return ref, nil, nil
	}
	x.sent[peer] = struct{}{}
	return ref, &m, nil
}

// Describe is Export for a message that travels to any peer (a packed remote key):
// the reference and the IPCExport message, the handle made once per allocation. The
// export is held until a Forget of the allocation gives this Describe back.
func (e *IPCExporter) Describe(ptr uintptr, n int) (IPCRef, IPCMessage, error) {
	if e == nil {
		return IPCRef{}, IPCMessage{}, fmt.Errorf("ipc describe: nil exporter: %w", ErrInvalidParam)
	}
	ref, m, _, err := e.export(ptr, n, true)
	return ref, m, err
}

// export finds or makes the export of ptr's allocation; hold counts a Describe.
func (e *IPCExporter) export(ptr uintptr, n int, hold bool) (IPCRef, IPCMessage, *ipcExport, error) {
	fail := func(err error) (IPCRef, IPCMessage, *ipcExport, error) { return IPCRef{}, IPCMessage{}, nil, err }
	if ptr == 0 || n <= 0 {
		return fail(fmt.Errorf("IPC export of %d bytes at %#x: %w", n, ptr, ErrInvalidParam))
	}
	a, err := e.drv.IPCAllocation(ptr)
	if err != nil {
		return fail(fmt.Errorf("IPC export of %#x: %w", ptr, err))
	}
	if !a.LegacyIPC {
		return fail(fmt.Errorf("IPC export of %#x: the allocation is not legacy-IPC capable (VMM memory from cuMemCreate?): %w", ptr, ErrUnsupported))
	}
	if err := checkAlloc(a); err != nil {
		return fail(err)
	}
	off := uint64(ptr) - a.Base
	if uint64(ptr) < a.Base || off+uint64(n) > a.Size {
		return fail(fmt.Errorf("IPC export of %d bytes at %#x: outside its allocation [%#x,+%d): %w", n, ptr, a.Base, a.Size, ErrInvalidParam))
	}
	ref := IPCRef{Alloc: a, Offset: off}
	e.mu.Lock()
	x := e.byBase[a.Base]
	if x != nil && x.alloc != a {
		x = nil // freed and reallocated here: a new allocation
	}
	if x == nil {
		e.mu.Unlock()
		// Outside the lock: a driver call. A racing export of the same allocation
		// makes a handle too; the first stored wins (both name the same memory).
		h, err := e.drv.IPCGetMemHandle(uintptr(a.Base))
		if err != nil {
			return fail(fmt.Errorf("IPC export of %#x: %w", ptr, err))
		}
		e.mu.Lock()
		if x = e.byBase[a.Base]; x == nil || x.alloc != a {
			x = &ipcExport{alloc: a, handle: h, sent: map[IPCPeer]struct{}{}}
			e.byBase[a.Base] = x
		}
	}
	if hold {
		x.holds++ // under the lock that found x: a Forget cannot drop it in between
	}
	e.mu.Unlock()
	return ref, IPCMessage{Kind: IPCExport, Alloc: a, Handle: x.handle}, x, nil
}

// Forget gives back one Describe of allocation a (its region closed), or, for an
// export no Describe holds (Export's alone), says a is about to be freed. Once nothing
// holds it the export is dropped, and Forget returns the peers Export sent its handle
// to, with the IPCInvalidate message to send them. a must be the allocation exported
// (its buffer id): another one at its base is left alone, since whoever holds it did
// not forget it. Forgetting what is not exported, or still held, returns no peers.
func (e *IPCExporter) Forget(a IPCAllocation) ([]IPCPeer, IPCMessage) {
	if e == nil {
		return nil, IPCMessage{}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	x := e.byBase[a.Base]
	if x == nil || !x.alloc.Same(a) {
		return nil, IPCMessage{}
	}
	if x.holds > 0 {
		if x.holds--; x.holds > 0 {
			return nil, IPCMessage{}
		}
	}
	delete(e.byBase, a.Base)
	peers := make([]IPCPeer, 0, len(x.sent))
	for p := range x.sent {
		peers = append(peers, p)
	}
	return peers, IPCMessage{Kind: IPCInvalidate, Alloc: x.alloc}
}

// PeerLost forgets that peer has any handle (a reconnected peer is a new one).
func (e *IPCExporter) PeerLost(peer IPCPeer) {
	if e == nil {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, x := range e.byBase {
		delete(x.sent, peer)
	}
}

// Exported is the number of allocations exported and not forgotten (nor replaced by
// another allocation at their base).
func (e *IPCExporter) Exported() int {
	if e == nil {
		return 0
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.byBase)
}

// ---- import side ----

// IPCImporter maps peers' allocations, each once, keyed by (peer, base, size, buffer
// id).
//
// A mapping is never unmapped while a reference Handle counted is outstanding: the
// address went into remote keys (copies, kernels, DeviceAddress), and touching an
// unmapped device address is a sticky CUDA error for the whole context. A newer
// export or an invalidation at the same (peer, base) only retires the old mapping:
// it stops resolving, and the Release that gives back its last reference unmaps it.
type IPCImporter struct {
	drv IPCDriver
	mu  sync.Mutex
	// maps: every open mapping, current or retired; current: the key that resolves
	// at each (peer, base).
	maps    map[ipcKey]*ipcMapping
	current map[ipcBase]ipcKey
	closed  bool
}

type ipcKey struct {
	peer IPCPeer
	IPCAllocation
}

type ipcBase struct {
	peer IPCPeer
	base uint64
}

// ipcMapping is one open mapping and the IPCExport messages applied to it that
// Release has not given back.
type ipcMapping struct {
	p    uintptr
	refs int
}

// NewIPCImporter makes the import side of the cache over drv.
func NewIPCImporter(drv IPCDriver) *IPCImporter {
	return &IPCImporter{drv: drv, maps: map[ipcKey]*ipcMapping{}, current: map[ipcBase]ipcKey{}}
}

func keyOf(peer IPCPeer, a IPCAllocation) ipcKey {
	a.LegacyIPC = false // not on the wire
	return ipcKey{peer, a}
}

// Handle applies a message from peer. IPCExport opens the handle unless that exact
// allocation is mapped already, checks the mapping against the allocation the message
// claims, and makes it the one that resolves at its base (retiring an older one
// there); a failed open or check leaves what was mapped as it was. IPCInvalidate
// retires the mapping named. A retired mapping is unmapped at once only when nothing
// references it.
func (im *IPCImporter) Handle(peer IPCPeer, m IPCMessage) error {
	if im == nil {
		return fmt.Errorf("ipc handle: nil importer: %w", ErrInvalidParam)
	}
	if err := checkAlloc(m.Alloc); err != nil {
		return err
	}
	k := keyOf(peer, m.Alloc)
	kb := ipcBase{peer, m.Alloc.Base}
	switch m.Kind {
	case IPCInvalidate:
		im.mu.Lock()
		var stale uintptr
		if _, ok := im.maps[k]; ok && im.current[kb] == k {
			delete(im.current, kb)
			stale = im.dropIfUnusedLocked(k)
		}
		im.mu.Unlock()
		return im.unmapIf(stale)
	case IPCExport:
	default:
		return fmt.Errorf("IPC message kind %d: %w", m.Kind, ErrInvalidParam)
	}
	im.mu.Lock()
	if im.closed {
		im.mu.Unlock()
		return fmt.Errorf("IPC import: %w", ErrClosed)
	}
	if x, ok := im.maps[k]; ok {
		// The same allocation again (a peer that re-sent it): one mapping.
		x.refs++
		stale := im.makeCurrentLocked(k, kb)
		im.mu.Unlock()
		return im.unmapIf(stale)
	}
	im.mu.Unlock()
	// Open before touching the old mapping: the handle may be garbage.
	p, err := im.drv.IPCOpenMemHandle(m.Handle)
	if err != nil {
		return fmt.Errorf("IPC import of %#x (buffer %d) from peer %d: %w", m.Alloc.Base, m.Alloc.BufferID, peer, err)
	}
	if err := im.checkMapping(p, m.Alloc); err != nil {
		return errors.Join(fmt.Errorf("IPC import of %#x (buffer %d) from peer %d: %w", m.Alloc.Base, m.Alloc.BufferID, peer, err), im.unmap(p))
	}
	im.mu.Lock()
	if im.closed {
		im.mu.Unlock()
		return errors.Join(im.unmap(p), fmt.Errorf("IPC import: %w", ErrClosed))
	}
	if x, ok := im.maps[k]; ok {
		// A racing Handle mapped it first: CUDA counts opens, so close ours.
		x.refs++
		stale := im.makeCurrentLocked(k, kb)
		im.mu.Unlock()
		return errors.Join(im.unmap(p), im.unmapIf(stale))
	}
	im.maps[k] = &ipcMapping{p: p, refs: 1}
	stale := im.makeCurrentLocked(k, kb)
	im.mu.Unlock()
	return im.unmapIf(stale)
}

// checkMapping holds the allocation a peer claims to the one the driver mapped: the
// claimed size bounds every later access through the mapping, so the mapping must
// start at p and be at least that large.
func (im *IPCImporter) checkMapping(p uintptr, claimed IPCAllocation) error {
	got, err := im.drv.IPCAllocation(p)
	if err != nil {
		return fmt.Errorf("the mapping at %#x has no allocation the driver knows: %w: %w", p, ErrInvalidParam, err)
	}
	if got.Base != uint64(p) || got.Size < claimed.Size {
		return fmt.Errorf("a %d-byte allocation was claimed, the mapping at %#x is [%#x,+%d): %w", claimed.Size, p, got.Base, got.Size, ErrInvalidParam)
	}
	return nil
}

// makeCurrentLocked makes k the key that resolves at kb, retiring the one before; it
// returns that one's address if nothing references it any more (the caller unmaps it).
func (im *IPCImporter) makeCurrentLocked(k ipcKey, kb ipcBase) uintptr {
	old, ok := im.current[kb]
	im.current[kb] = k
	if !ok || old == k {
		return 0
	}
	return im.dropIfUnusedLocked(old)
}

// dropIfUnusedLocked forgets the retired mapping of k if no reference holds it and
// returns its address to unmap; with references left, the last Release unmaps it.
func (im *IPCImporter) dropIfUnusedLocked(k ipcKey) uintptr {
	x, ok := im.maps[k]
	if !ok || x.refs > 0 {
		return 0
	}
	delete(im.maps, k)
	return x.p
}

// Resolve is the local address of n bytes at ref in peer's memory: the mapping must
// be there and current (the IPCExport message comes with, or before, the first
// operation naming an allocation), else ErrInvalidParam.
func (im *IPCImporter) Resolve(peer IPCPeer, ref IPCRef, n int) (uintptr, error) {
	if im == nil {
		return 0, fmt.Errorf("ipc resolve: nil importer: %w", ErrInvalidParam)
	}
	if n <= 0 || ref.Offset+uint64(n) > ref.Alloc.Size || ref.Offset+uint64(n) < ref.Offset {
		return 0, fmt.Errorf("IPC reference of %d bytes at offset %d of a %d-byte allocation: %w", n, ref.Offset, ref.Alloc.Size, ErrInvalidParam)
	}
	k := keyOf(peer, ref.Alloc)
	im.mu.Lock()
	x, ok := im.maps[k]
	ok = ok && im.current[ipcBase{peer, ref.Alloc.Base}] == k
	im.mu.Unlock()
	if !ok {
		return 0, fmt.Errorf("IPC reference to %#x (buffer %d) of peer %d: not mapped: %w", ref.Alloc.Base, ref.Alloc.BufferID, peer, ErrInvalidParam)
	}
	return x.p + uintptr(ref.Offset), nil
}

// Release gives back one IPCExport of peer's allocation a that Handle applied (the
// remote key that carried it is closed or revoked); the last one unmaps it, current or
// retired. Releasing what is not mapped (dropped already: peer lost, closed) does
// nothing.
func (im *IPCImporter) Release(peer IPCPeer, a IPCAllocation) error {
	if im == nil {
		return fmt.Errorf("ipc release: nil importer: %w", ErrInvalidParam)
	}
	k := keyOf(peer, a)
	im.mu.Lock()
	x, ok := im.maps[k]
	if !ok {
		im.mu.Unlock()
		return nil
	}
	if x.refs--; x.refs > 0 {
		im.mu.Unlock()
		return nil
	}
	delete(im.maps, k)
	if kb := (ipcBase{peer, a.Base}); im.current[kb] == k {
		delete(im.current, kb)
	}
	im.mu.Unlock()
	return im.unmap(x.p)
}

// PeerLost unmaps everything of peer.
func (im *IPCImporter) PeerLost(peer IPCPeer) error {
	if im == nil {
		return fmt.Errorf("ipc peer lost: nil importer: %w", ErrInvalidParam)
	}
	return im.drop(func(k ipcKey) bool { return k.peer == peer })
}

// Mapped is the number of current mappings (those that resolve).
func (im *IPCImporter) Mapped() int {
	if im == nil {
		return 0
	}
	im.mu.Lock()
	defer im.mu.Unlock()
	return len(im.current)
}

// Retired is the number of mappings that no longer resolve but stay open for the
// references that hold them.
func (im *IPCImporter) Retired() int {
	if im == nil {
		return 0
	}
	im.mu.Lock()
	defer im.mu.Unlock()
	return len(im.maps) - len(im.current)
}

// Close unmaps everything; later exports fail with ErrClosed.
func (im *IPCImporter) Close() error {
	if im == nil {
		return fmt.Errorf("ipc importer close: nil importer: %w", ErrInvalidParam)
	}
	im.mu.Lock()
	im.closed = true
	im.mu.Unlock()
	return im.drop(func(ipcKey) bool { return true })
}

func (im *IPCImporter) drop(match func(ipcKey) bool) error {
	im.mu.Lock()
	var ps []uintptr
	for k, x := range im.maps {
		if match(k) {
			ps = append(ps, x.p)
			delete(im.maps, k)
			kb := ipcBase{k.peer, k.Base}
			if im.current[kb] == k {
				delete(im.current, kb)
			}
		}
	}
	im.mu.Unlock()
	var first error
	for _, p := range ps {
		if err := im.unmap(p); err != nil && first == nil {
			first = err
		}
	}
	return first
}

func (im *IPCImporter) unmap(p uintptr) error {
	if err := im.drv.IPCCloseMemHandle(p); err != nil {
		return fmt.Errorf("IPC unmap of %#x: %w", p, err)
	}
	return nil
}

// unmapIf unmaps p unless it is 0 (nothing to unmap).
func (im *IPCImporter) unmapIf(p uintptr) error {
	if p == 0 {
		return nil
	}
	return im.unmap(p)
}
