package ucp

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/ucpx/ucpx/cgo/ucx"
	"github.com/ucpx/ucpx/protocol"
	"github.com/ucpx/ucpx/stream/streamcore"
)

// Feature selects the UCX capabilities a context is created with.
type Feature uint64

const (
	FeatureTag    = Feature(ucx.FeatureTag)
	FeatureRMA    = Feature(ucx.FeatureRMA)
	FeatureAMO32  = Feature(ucx.FeatureAMO32)
	FeatureAMO64  = Feature(ucx.FeatureAMO64)
	FeatureAM     = Feature(ucx.FeatureAM)
	FeatureWakeup = Feature(ucx.FeatureWakeup)
	// FeatureAll is every feature ucpx uses; the default when ContextParams.Features is 0.
	FeatureAll = FeatureTag | FeatureRMA | FeatureAMO32 | FeatureAMO64 | FeatureAM | FeatureWakeup
)

// MemoryType is a ucs_memory_type_t.
type MemoryType int

const (
	// MemoryUnknown lets UCX detect the memory type (the default in RequestParam).
	MemoryUnknown     MemoryType = -1
	MemoryHost        MemoryType = ucx.MemHost
	MemoryCUDA        MemoryType = ucx.MemCUDA
	MemoryCUDAManaged MemoryType = ucx.MemCUDAManaged
	MemoryROCm        MemoryType = ucx.MemROCm
	MemoryROCmManaged MemoryType = ucx.MemROCmManaged
)

// known reports whether m is one of the memory types above.
func (m MemoryType) known() bool { return m >= MemoryUnknown && m <= MemoryROCmManaged }

func (m MemoryType) String() string {
	switch m {
	case MemoryUnknown:
		return "unknown"
	case MemoryHost:
		return "host"
	case MemoryCUDA:
		return "cuda"
	case MemoryCUDAManaged:
		return "cuda-managed"
	case MemoryROCm:
		return "rocm"
	case MemoryROCmManaged:
		return "rocm-managed"
	}
	return fmt.Sprintf("MemoryType(%d)", int(m))
}

// ContextParams configures NewContext.
type ContextParams struct {
	// Features defaults to FeatureAll.
	Features Feature
	// Config overrides UCX configuration on top of the UCX_* environment, by name
	// with or without the UCX_ prefix: {"TLS": "tcp", "RNDV_THRESH": "16k"}.
	Config map[string]string
	// EstimatedEndpoints helps UCX size its resources; 0 leaves the default.
	EstimatedEndpoints int
	// Protocol tunes how buffers travel under conditions (staging parts, completion
	// polling, doorbell); the zero value means protocol.DefaultConfig.
	Protocol protocol.Config
	// AuthKey is the secret every peer must prove it holds (at least MinAuthKeyLen
	// bytes, GenerateAuthKey makes one): Listen and Connect run a mutual
	// challenge-response before any worker address or rkey crosses, and worker
	// addresses and rkeys are sealed with it. Empty: the key file named by
	// UCPX_AUTH_KEY_FILE (`ucpx keygen` writes one), if set; else no key, and Listen
	// only on loopback (README, "Trust model").
	AuthKey []byte
	// RevokeTimeout bounds how long MemH.Close waits for the peers that imported the
	// region's key to acknowledge its revocation (0: DefaultRevokeTimeout).
	RevokeTimeout time.Duration
	// DeviceUUID is the UUID of the CUDA device this process's buffers live on
	// (cuDeviceGetUuid; PyTorch: torch.cuda.get_device_properties(i).uuid). Peers on
	// this host learn it, with the boot and IPC namespace, in the handshake or the
	// sealed worker address, and Endpoint.Reach tells whether CUDA IPC reaches them.
	// Zero: no device (or Device's).
	DeviceUUID [16]byte
	// Device is the stream backend of the device this process's buffers live on (a
	// CUDA backend from package stream; it must implement streamcore.DeviceIPC). With
	// it, device memory of this host travels by CUDA IPC where UCX has no CUDA
	// transport: MemMapPtr with MemoryCUDA exports the allocation in the region's
	// remote key, a same-host peer maps it in UnpackRkey, and RMA on it moves by the
	// copy engine (README, "Device memory on one host"). Its UUID is DeviceUUID's
	// default. The context does not close it.
	Device streamcore.Backend
}

// Context is a ucp_context_h: the UCX configuration and the memory registrations.
// It is safe for concurrent use.
type Context struct {
	mu       sync.Mutex
	raw      *ucx.Context
	features Feature
	memTypes uint64
	protocol protocol.Config
	workers  map[*Worker]struct{}
	memhs    map[*MemH]struct{}
	exports  map[uint64]*MemH       // by key id, once packed
	ipc      *ctxIPC                // the CUDA IPC path, with ContextParams.Device
	pulls    map[uint64]*pullExport // allocations exported for pulled active messages, by base
	// pullsSweep: the number of pulls above which pullKey next drops those of freed
	// allocations (sweepPulls).
	pullsSweep int
	closed     bool
	// cleanupOwed: Close found workers still closing; the last of them cleans up.
	cleanupOwed bool
	trust       *trust
	// revokeTimeout is ContextParams.RevokeTimeout, resolved.
	revokeTimeout time.Duration
	// limbo holds, by imported key, the mappings a closed worker keeps because copies
	// through them were abandoned still queued (Worker.Close, abandonIPCLocked): each
	// channel is closed once they are released. A revocation of the key acknowledges
	// only after that.
	limboMu sync.Mutex
	limbo   map[heldKeyID][]chan struct{}
}

// NewContext creates a UCX context; UCX reads its UCX_* environment variables here.
func NewContext(p ContextParams) (*Context, error) {
	if p.Features == 0 {
		p.Features = FeatureAll
	}
	if p.Features&^FeatureAll != 0 {
		return nil, opErr("init", ErrInvalidParam, "unknown Features %#x", uint64(p.Features&^FeatureAll))
	}
	if p.EstimatedEndpoints < 0 {
		return nil, opErr("init", ErrInvalidParam, "EstimatedEndpoints %d", p.EstimatedEndpoints)
	}
	if p.RevokeTimeout < 0 {
		return nil, opErr("init", ErrInvalidParam, "RevokeTimeout %v", p.RevokeTimeout)
	}
	if p.RevokeTimeout == 0 {
		p.RevokeTimeout = DefaultRevokeTimeout
	}
	key, err := loadAuthKey(p.AuthKey)
	if err != nil {
		return nil, opErr("init", err, "auth key")
	}
	tr, err := newTrust(key)
	if err != nil {
		return nil, opErr("init", err, "auth key")
	}
	var ipc *ctxIPC
	if p.Device != nil {
		if ipc, err = newCtxIPC(p.Device); err != nil {
			return nil, err
		}
		if p.DeviceUUID == ([16]byte{}) {
			if p.DeviceUUID, err = ipc.dev.DeviceUUID(); err != nil {
				return nil, opErr("init", err, "ContextParams.Device's UUID")
			}
		}
	}
	tr.host.Device = p.DeviceUUID
	proto, err := p.Protocol.Resolve()
	if err != nil {
		return nil, opErr("init", err, "ContextParams.Protocol")
	}
	cfg := make(map[string]string, len(p.Config))
	for k, v := range p.Config {
		cfg[strings.TrimPrefix(k, "UCX_")] = v
	}
	raw, st := ucx.Init(uint64(p.Features), cfg, p.EstimatedEndpoints)
	if err := statusErr(st); err != nil {
		return nil, opErr("init", err, "features %#x config %v", uint64(p.Features), p.Config)
	}
	live.contexts.Add(1)
	c := &Context{
		raw:           raw,
		features:      p.Features,
		memTypes:      raw.MemoryTypes(),
		protocol:      proto,
		workers:       map[*Worker]struct{}{},
		memhs:         map[*MemH]struct{}{},
		exports:       map[uint64]*MemH{},
		trust:         tr,
		revokeTimeout: p.RevokeTimeout,
		ipc:           ipc,
	}
	contexts.Store(tr.id, c)
	return c, nil
}

// Features reports the features the context was created with.
func (c *Context) Features() Feature {
	if c == nil {
		return 0
	}
	return c.features
}

// Device is ContextParams.Device: the backend whose device memory travels to same-host
// peers by CUDA IPC (nil without one).
func (c *Context) Device() streamcore.DeviceIPC {
	if c == nil {
		return nil
	}
	if c.ipc == nil {
		return nil
	}
	return c.ipc.dev
}

// MemoryTypes lists the memory types UCX can communicate from directly (queried once).
func (c *Context) MemoryTypes() []MemoryType {
	if c == nil {
		return nil
	}
	var out []MemoryType
	for m := MemoryHost; m < MemoryType(ucx.MemLast); m++ {
		if c.memTypes&(1<<uint(m)) != 0 {
			out = append(out, m)
		}
	}
	return out
}

// SupportsMemoryType reports whether UCX handles buffers of type m without staging.
func (c *Context) SupportsMemoryType(m MemoryType) bool {
	if c == nil {
		return false
	}
	return m >= 0 && c.memTypes&(1<<uint(m)) != 0
}

// Print writes UCX's own description of the context to standard output.
func (c *Context) Print() {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.closed {
		c.raw.Print()
	}
}

// Close closes every worker and memory handle of the context, then the context.
// A second Close returns ErrClosed.
func (c *Context) Close() error {
	if c == nil {
		return opErr("cleanup", ErrInvalidParam, "nil context")
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return opErr("cleanup", ErrClosed, "")
	}
	c.closed = true
	contexts.Delete(c.trust.id)
	workers := make([]*Worker, 0, len(c.workers))
	for w := range c.workers {
		workers = append(workers, w)
	}
	memhs := make([]*MemH, 0, len(c.memhs))
	for m := range c.memhs {
		memhs = append(memhs, m)
	}
	c.mu.Unlock()
	// Importers are told their keys are revoked (best effort, nobody waits): once the
	// workers are gone nothing of ours answers their puts any more.
	for _, m := range memhs {
		m.notifyRevoked()
	}
	for _, w := range workers {
		_ = w.Close()
	}
	for _, m := range memhs {
		_ = m.release()
	}
	if c.ipc != nil {
		_ = c.ipc.imp.Close()
	}
	// A worker another goroutine is still closing (its Close came first, and this
	// one's returned ErrClosed at once) still uses the UCX context: the last of them
	// to finish cleans up instead (Worker.Close).
	c.mu.Lock()
	c.cleanupOwed = len(c.workers) > 0
	owed := c.cleanupOwed
	c.mu.Unlock()
	if !owed {
		c.cleanup()
	}
	return nil
}

// cleanup releases the UCX context, once no worker of it exists.
func (c *Context) cleanup() {
	c.raw.Cleanup()
	live.contexts.Add(-1)
}

func (c *Context) register(add func() error) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ErrClosed
	}
	return add()
}

// MemH is registered memory (ucp_mem_h): either user memory mapped with MemMap
// (kept pinned until Close) or memory UCX allocated with MemAlloc.
type MemH struct {
	ctx     *Context
	raw     *ucx.MemH
	addr    unsafe.Pointer
	length  int
	memType MemoryType
	// ipcExport: device memory registered for CUDA IPC (no UCX registration), the
	// message its packed keys carry.
	ipcExport *protocol.IPCMessage
	// shared: Signals in a shared segment; packed keys name it (sharedwords.go).
	shared *streamcore.SharedWords
	pin    runtime.Pinner
	closed bool // under ctx.mu
	// keyID names the region in its packed rkeys; importers are the peers that
	// unpacked them (under ctx.mu). revoked: Close began, no new keys.
	keyID     uint64
	importers map[[idLen]byte]*importer
	revoked   bool
	dead      atomic.Bool // unmapped: Bytes is nil
}

// MemMap registers buf for RMA and zero-copy. buf stays pinned until Close: UCX keeps
// its address. For memory that is not Go memory (device memory, C memory) use MemMapPtr.
func (c *Context) MemMap(buf []byte) (*MemH, error) {
	if c == nil {
		return nil, opErr("mem_map", ErrInvalidParam, "nil context")
	}
	if len(buf) == 0 {
		return nil, opErr("mem_map", ErrInvalidParam, "empty buffer")
	}
	m := &MemH{ctx: c, memType: MemoryHost}
	m.pin.Pin(&buf[0])
	if err := c.mapInto(m, unsafe.Pointer(&buf[0]), len(buf), false, MemoryHost); err != nil {
		m.pin.Unpin()
		return nil, err
	}
	return m, nil
}

// MemMapPtr registers memory that is not Go memory: C memory, pinned host memory or
// (where UCX supports it) device memory of the given type.
func (c *Context) MemMapPtr(addr uintptr, length int, memType MemoryType) (*MemH, error) {
	if c == nil {
		return nil, opErr("mem_map", ErrInvalidParam, "nil context")
	}
	if addr == 0 || length <= 0 {
		return nil, opErr("mem_map", ErrInvalidParam, "addr %#x length %d", addr, length)
	}
	if !memType.known() {
		return nil, opErr("mem_map", ErrInvalidParam, "unknown memory type %d", int(memType))
	}
	m := &MemH{ctx: c, memType: memType}
	if memType > MemoryHost && !c.SupportsMemoryType(memType) {
		if memType == MemoryCUDA && c.ipc != nil {
			if err := c.mapDevice(m, addr, length); err != nil {
				return nil, err
			}
			return m, nil
		}
		return nil, opErr("mem_map", ErrUnsupported, "%s memory: UCX here has no transport for it; with ContextParams.Device, MemoryCUDA regions travel to same-host peers by CUDA IPC", memType)
	}
	if err := c.mapInto(m, ucx.Addr(addr), length, false, memType); err != nil {
		return nil, err
	}
	return m, nil
}

// MemAlloc allocates and registers length bytes of host memory (the registered
// buffer a hot path should reuse); Bytes gives access to exactly length bytes, and the
// packed rkey grants a peer exactly those.
func (c *Context) MemAlloc(length int) (*MemH, error) {
	if c == nil {
		return nil, opErr("mem_map", ErrInvalidParam, "nil context")
	}
	if length <= 0 {
		return nil, opErr("mem_map", ErrInvalidParam, "allocate length %d", length)
	}
	// UCX's shared-memory allocator writes the whole length into its backing file to
	// test for space, so a length beyond what the machine has fills memory until the
	// kernel kills the process instead of failing: refuse it here.
	if avail, ok := availableMemory(); ok && uint64(length) > avail {
		return nil, opErr("mem_map", ErrNoMemory, "allocate length %d: the machine has %d bytes available", length, avail)
	}
	m := &MemH{ctx: c, memType: MemoryHost}
	if err := c.mapInto(m, nil, length, true, MemoryHost); err != nil {
		return nil, err
	}
	return m, nil
}

func (c *Context) mapInto(m *MemH, addr unsafe.Pointer, length int, allocate bool, memType MemoryType) error {
	return c.register(func() error {
		raw, a, n, st := c.raw.MemMap(addr, length, allocate, int(memType))
		if err := statusErr(st); err != nil {
			return opErr("mem_map", err, "length %d allocate %v type %s", length, allocate, memType)
		}
		// UCX rounds an allocation up to whole pages; the region is what was asked
		// for, so Bytes, Len and the rkey's range are exact.
		m.raw, m.addr, m.length = raw, a, min(n, length)
		m.keyID = newKeyID()
		m.importers = map[[idLen]byte]*importer{}
		c.memhs[m] = struct{}{}
		live.memhs.Add(1)
		return nil
	})
}

// Address is the start of the registered region.
func (m *MemH) Address() uintptr {
	if m == nil {
		return 0
	}
	return uintptr(m.addr)
}

// Len is the length of the registered region.
func (m *MemH) Len() int {
	if m == nil {
		return 0
	}
	return m.length
}

// MemoryType is the type of the registered memory.
func (m *MemH) MemoryType() MemoryType {
	if m == nil {
		return MemoryUnknown // not MemoryHost, which the zero value would claim
	}
	return m.memType
}

// Bytes is the registered host memory as a slice (nil for device memory, and once
// Close released it). The slice is valid until Close.
func (m *MemH) Bytes() []byte {
	if m == nil {
		return nil
	}
	if m.memType != MemoryHost || m.addr == nil || m.dead.Load() {
		return nil
	}
	return unsafe.Slice((*byte)(m.addr), m.length)
}

// PackRkey returns the remote key of the region in ucpx's wire form, sealed (README,
// "Trust model"): the region's bounds and UCX's packed rkey, encrypted and
// authenticated under the context's auth key and bound to this context's identity, so
// a peer's UnpackRkey refuses what was forged, altered or replayed by another peer
// instead of handing it to UCX. MemH.Close revokes it.
func (m *MemH) PackRkey() ([]byte, error) {
	if m == nil {
		return nil, opErr("rkey_pack", ErrInvalidParam, "nil memh")
	}
	m.ctx.mu.Lock()
	defer m.ctx.mu.Unlock()
	if m.closed || m.ctx.closed {
		return nil, opErr("rkey_pack", ErrClosed, "")
	}
	if m.revoked {
		return nil, opErr("rkey_pack", ErrRevoked, "Close is revoking the region")
	}
	var packed []byte
	if m.ipcExport != nil {
		packed = ipcPayload(*m.ipcExport)
	} else {
		var st ucx.Status
		packed, st = m.ctx.raw.RkeyPack(m.raw)
		if err := statusErr(st); err != nil {
			return nil, opErr("rkey_pack", err, "")
		}
		if m.shared != nil {
			packed = sharedWordsPayload(*m.shared, packed)
		}
	}
	m.ctx.exports[m.keyID] = m
	t := m.ctx.trust
	return sealRkey(t.seal, t.id, m.keyID, uint64(uintptr(m.addr)), uint64(m.length), packed), nil
}

// Close revokes the region's key and deregisters the memory (frees it if UCX
// allocated it). Peers that unpacked the key are told; their later operations with it
// fail with ErrRevoked, and the memory is released only once each acknowledged (after
// flushing what it had in flight) or failed. A peer that does neither within
// ContextParams.RevokeTimeout makes Close fail with an error matching ErrTimedOut that
// names it: the memory then stays registered (Close again to retry; Context.Close
// releases it regardless). Peers in other processes are told with active messages: a
// context without FeatureAM neither hears of them nor tells them. Local operations using
// the memory must have completed. A second Close after success returns ErrClosed.
//
// A key packed before Close and unpacked after it does not reach the memory from this
// process (UnpackRkey fails with ErrRevoked); a peer in another process is revoked
// when its import notice arrives, and until then its operations with the key still
// run: do not unpack a key of a region its owner may have closed.
func (m *MemH) Close() error {
	if m == nil {
		return opErr("mem_unmap", ErrInvalidParam, "nil memh")
	}
	c := m.ctx
	c.mu.Lock()
	if m.closed {
		c.mu.Unlock()
		return opErr("mem_unmap", ErrClosed, "")
	}
	m.revoked = true
	c.mu.Unlock()
	if left := m.revoke(c.revokeTimeout); len(left) > 0 {
		names := make([]string, len(left))
		for i, imp := range left {
			names[i] = imp.String()
		}
		return opErr("mem_unmap", ErrTimedOut, "revoking the region's key: %s neither acknowledged nor failed within %v; the memory stays registered (Close again to retry)", strings.Join(names, ", "), c.revokeTimeout)
	}
	return m.release()
}

// notifyRevoked tells the region's importers that its key is revoked, without waiting.
func (m *MemH) notifyRevoked() {
	c := m.ctx
	c.mu.Lock()
	m.revoked = true
	var peers [][idLen]byte
	for p, imp := range m.importers {
		if imp.local == nil {
			peers = append(peers, p)
		}
	}
	c.mu.Unlock()
	for _, p := range peers {
		c.anyEndpointTo(p).sendControl(ctlRevoke, m.keyID)
	}
}

// release deregisters the memory.
func (m *MemH) release() error {
	c := m.ctx
	c.mu.Lock()
	if m.closed {
		c.mu.Unlock()
		return opErr("mem_unmap", ErrClosed, "")
	}
	m.closed = true
	m.revoked = true
	m.dead.Store(true)
	delete(c.memhs, m)
	delete(c.exports, m.keyID)
	var st ucx.Status
	if m.raw != nil {
		st = c.raw.MemUnmap(m.raw)
	}
	c.mu.Unlock()
	c.forgetDevice(m)
	m.pin.Unpin()
	live.memhs.Add(-1)
	return opErr("mem_unmap", statusErr(st), "")
}

func newKeyID() uint64 {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return binary.LittleEndian.Uint64(b[:])
}

// availableMemory is the kernel's estimate of memory available for new allocations
// (MemAvailable of /proc/meminfo); false where it cannot tell.
func availableMemory() (uint64, bool) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, false
	}
	for line := range strings.Lines(string(b)) {
		rest, ok := strings.CutPrefix(line, "MemAvailable:")
		if !ok {
			continue
		}
		kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
		if err != nil {
			return 0, false
		}
		return kb << 10, true
	}
	return 0, false
}
