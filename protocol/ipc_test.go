package protocol

import (
	"encoding/binary"
	"errors"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// fakeIPC is a driver of two "processes" in one: allocations of the exporter, and the
// mappings the importer opened. A handle encodes the allocation's base and buffer id.
type fakeIPC struct {
	mu      sync.Mutex
	allocs  map[uint64]IPCAllocation // by base
	nextID  uint64
	gets    int
	opens   map[uintptr]*fakeMap // mapped address -> handle
	nextMap uintptr
	opened  int
	closed  int
}

// fakeMap: CUDA maps a handle opened twice in one process once, and counts the opens.
// size is the real size of the allocation the handle named.
type fakeMap struct {
	h    IPCHandle
	refs int
	size uint64
}

func newFakeIPC() *fakeIPC {
	return &fakeIPC{allocs: map[uint64]IPCAllocation{}, opens: map[uintptr]*fakeMap{}, nextMap: 0x7f0000000000}
}

func (f *fakeIPC) alloc(base, size uint64, legacy bool) IPCAllocation {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.nextID++
	a := IPCAllocation{Base: base, Size: size, BufferID: f.nextID, LegacyIPC: legacy}
	f.allocs[base] = a
	return a
}

func (f *fakeIPC) free(base uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.allocs, base)
}

func (f *fakeIPC) IPCAllocation(ptr uintptr) (IPCAllocation, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, a := range f.allocs {
		if uint64(ptr) >= a.Base && uint64(ptr) < a.Base+a.Size {
			return a, nil
		}
	}
	// The importer's side: a mapping is an allocation of the size the handle named.
	for p, m := range f.opens {
		if ptr >= p && uint64(ptr) < uint64(p)+m.size {
			return IPCAllocation{Base: uint64(p), Size: m.size, BufferID: binary.LittleEndian.Uint64(m.h[8:])}, nil
		}
	}
	return IPCAllocation{}, ErrInvalidParam
}

func (f *fakeIPC) IPCGetMemHandle(base uintptr) (IPCHandle, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.gets++
	a := f.allocs[uint64(base)]
	var h IPCHandle
	binary.LittleEndian.PutUint64(h[:], a.Base)
	binary.LittleEndian.PutUint64(h[8:], a.BufferID)
	return h, nil
}

func (f *fakeIPC) IPCOpenMemHandle(h IPCHandle) (uintptr, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	a, ok := f.allocs[binary.LittleEndian.Uint64(h[:])]
	if !ok || a.BufferID != binary.LittleEndian.Uint64(h[8:]) {
		return 0, errors.New("fake driver: handle of no live allocation")
	}
	f.opened++
	for p, m := range f.opens {
		if m.h == h {
			m.refs++
			return p, nil
		}
	}
	f.nextMap += 1 << 30
	f.opens[f.nextMap] = &fakeMap{h: h, refs: 1, size: a.Size}
	return f.nextMap, nil
}

func (f *fakeIPC) IPCCloseMemHandle(p uintptr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	m, ok := f.opens[p]
	if !ok {
		return errors.New("fake driver: close of an address not mapped")
	}
	if m.refs--; m.refs == 0 {
		delete(f.opens, p)
	}
	f.closed++
	return nil
}

// mappedBuffer is the buffer id behind a mapped address (what the handle named).
func (f *fakeIPC) mappedBuffer(p uintptr) uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	for base, m := range f.opens {
		if p >= base && p < base+1<<30 {
			return binary.LittleEndian.Uint64(m.h[8:])
		}
	}
	return 0
}

// send runs an export for peer through the wire to im, as an operation would.
func send(t *testing.T, ex *IPCExporter, im *IPCImporter, peer IPCPeer, ptr uintptr, n int) (IPCRef, bool) {
	t.Helper()
	ref, msg, err := ex.Export(peer, ptr, n)
	require.NoError(t, err)
	if msg != nil {
		b, err := msg.AppendBinary(nil)
		require.NoError(t, err)
		got, err := DecodeIPCMessage(b)
		require.NoError(t, err)
		require.NoError(t, im.Handle(peer, got))
	}
	return ref, msg != nil
}

// Exported once per allocation, sent once per peer, opened once per peer; a buffer
// freed and reallocated at the same address (same size) is a new allocation: exported
// again, and the importer retires the stale mapping (unmapped once the keys holding it
// are released) and never resolves the new reference to the old memory.
func TestIPCCacheAcrossReallocation(t *testing.T) {
	f := newFakeIPC()
	ex := NewIPCExporter(f)
	im := NewIPCImporter(f)
	const base, size = 0x10000000, 1 << 20
	a1 := f.alloc(base, size, true)
	for i := range 5 {
		ref, sent := send(t, ex, im, 1, base+uintptr(i)*4096, 4096)
		require.Equal(t, i == 0, sent, "only the first operation carries the handle")
		p, err := im.Resolve(1, ref, 4096)
		require.NoError(t, err)
		require.Equal(t, a1.BufferID, f.mappedBuffer(p))
		require.Equal(t, uint64(i*4096), ref.Offset)
	}
	_, sent := send(t, ex, im, 2, base, 8)
	require.True(t, sent, "a second peer gets the handle with its first operation")
	require.Equal(t, 1, f.gets, "one cuIpcGetMemHandle per allocation")
	require.Equal(t, 2, f.opened, "one open per peer")
	require.Equal(t, 2, im.Mapped())

	// Freed and reallocated at the same address and size.
	oldRef, _, err := ex.Export(1, base, 8)
	require.NoError(t, err)
	f.free(base)
	a2 := f.alloc(base, size, true)
	require.NotEqual(t, a1.BufferID, a2.BufferID)
	ref, sent := send(t, ex, im, 1, base+64, 64)
	require.True(t, sent, "a reallocated buffer is exported again")
	require.Equal(t, 2, f.gets)
	require.Zero(t, f.closed, "the stale mapping is still referenced: retired, not closed")
	require.Equal(t, 1, im.Retired())
	p, err := im.Resolve(1, ref, 64)
	require.NoError(t, err)
	require.Equal(t, a2.BufferID, f.mappedBuffer(p))
	_, err = im.Resolve(1, oldRef, 8)
	require.ErrorIs(t, err, ErrInvalidParam, "the old allocation's reference never resolves to the new memory")
	require.NoError(t, im.Release(1, oldRef.Alloc))
	require.Equal(t, 1, f.closed, "its last reference given back, the stale mapping is closed")
	require.Zero(t, im.Retired())
	// Resending the same export (a peer that repeats itself) opens nothing.
	require.NoError(t, im.Handle(1, IPCMessage{Kind: IPCExport, Alloc: ref.Alloc}))
	require.Equal(t, 3, f.opened)

	// Forget: the peers that had it are told to unmap; the mapping stops resolving
	// and is closed with its last reference.
	peers, inv := ex.Forget(ref.Alloc)
	require.ElementsMatch(t, []IPCPeer{1}, peers, "peer 2 only had the old allocation")
	require.Equal(t, IPCInvalidate, inv.Kind)
	require.NoError(t, im.Handle(1, inv))
	_, err = im.Resolve(1, ref, 64)
	require.ErrorIs(t, err, ErrInvalidParam)
	require.Equal(t, 1, f.closed)
	require.NoError(t, im.Release(1, ref.Alloc))
	require.NoError(t, im.Release(1, ref.Alloc))
	require.Equal(t, 2, f.closed)
	peers, _ = ex.Forget(ref.Alloc)
	require.Empty(t, peers)
	require.Zero(t, ex.Exported())

	// Peer 2 still maps a1 (never invalidated, since the exporter had replaced it):
	// losing the peer unmaps it.
	require.Equal(t, 1, im.Mapped())
	require.NoError(t, im.PeerLost(2))
	require.Zero(t, im.Mapped())
	require.Empty(t, f.opens)

	// Close unmaps the rest, and refuses later imports.
	f.alloc(0x20000000, 4096, true)
	send(t, ex, im, 3, 0x20000000, 4096)
	require.NoError(t, im.Close())
	require.Empty(t, f.opens)
	ex.PeerLost(3)
	_, msg, err := ex.Export(3, 0x20000000, 4096)
	require.NoError(t, err)
	require.NotNil(t, msg, "a lost peer that comes back gets the handle again")
	require.ErrorIs(t, im.Handle(3, *msg), ErrClosed)
}

// A described export (a registered region's) stays while a Describe holds it and goes
// with the last Forget; a Forget of an allocation freed and replaced at its base
// leaves the newer export alone; many regions registered and closed leave nothing.
func TestIPCExportForgottenWithItsRegions(t *testing.T) {
	f := newFakeIPC()
	ex := NewIPCExporter(f)
	im := NewIPCImporter(f)
	const base, size = 0x10000000, 1 << 20
	a1 := f.alloc(base, size, true)
	_, m1, err := ex.Describe(base, 4096)
	require.NoError(t, err)
	_, _, err = ex.Describe(base+4096, 4096) // a second region of the allocation
	require.NoError(t, err)
	require.Equal(t, 1, f.gets)
	require.NoError(t, im.Handle(1, m1))
	peers, _ := ex.Forget(a1)
	require.Empty(t, peers)
	require.Equal(t, 1, ex.Exported(), "the second region still holds the export")
	_, _, err = ex.Describe(base, 8)
	require.NoError(t, err)
	require.Equal(t, 1, f.gets, "a held export is not made again")
	ex.Forget(a1)
	ex.Forget(a1)
	require.Zero(t, ex.Exported(), "the last region closed, the export goes")
	ex.Forget(a1)
	require.Zero(t, ex.Exported(), "a Forget too many does nothing")

	// Freed without forgetting and reallocated at the base: the new export replaces
	// the stale one, and the stale one's Forget does not drop it.
	_, _, err = ex.Describe(base, 8)
	require.NoError(t, err)
	f.free(base)
	a2 := f.alloc(base, size, true)
	_, m2, err := ex.Describe(base, 8)
	require.NoError(t, err)
	require.Equal(t, a2.BufferID, m2.Alloc.BufferID)
	ex.Forget(a1)
	require.Equal(t, 1, ex.Exported(), "the newer allocation's export stays")
	gets := f.gets
	_, _, err = ex.Describe(base, 8)
	require.NoError(t, err)
	require.Equal(t, gets, f.gets)
	ex.Forget(a2)
	ex.Forget(a2)
	require.Zero(t, ex.Exported())

	// An export only Export made goes with its Forget, and its peers are told: the
	// importer's mapping stops resolving and closes with its last reference.
	require.NoError(t, im.Release(1, a1))
	ref, sent := send(t, ex, im, 1, base, 64)
	require.True(t, sent)
	closed := f.closed
	peers, inv := ex.Forget(ref.Alloc)
	require.Equal(t, []IPCPeer{1}, peers)
	require.Zero(t, ex.Exported())
	require.NoError(t, im.Handle(1, inv))
	require.Zero(t, im.Mapped())
	require.Equal(t, 1, im.Retired())
	require.NoError(t, im.Release(1, ref.Alloc))
	require.Zero(t, im.Retired())
	require.Equal(t, closed+1, f.closed, "the invalidated mapping is closed with its last reference")

	// Many short-lived regions at ever new addresses: the cache stays empty.
	for i := range 1000 {
		b := uint64(0x20000000 + i*size)
		a := f.alloc(b, size, true)
		_, _, err := ex.Describe(uintptr(b), size)
		require.NoError(t, err)
		ex.Forget(a)
		f.free(b)
	}
	require.Zero(t, ex.Exported())
}

func TestIPCExportRefusals(t *testing.T) {
	f := newFakeIPC()
	ex := NewIPCExporter(f)
	f.alloc(0x10000000, 4096, false) // VMM memory: not legacy-IPC capable
	_, _, err := ex.Export(1, 0x10000000, 8)
	require.ErrorIs(t, err, ErrUnsupported)
	f.alloc(0x20000000, 4096, true)
	_, _, err = ex.Export(1, 0x20000000+4000, 100)
	require.ErrorIs(t, err, ErrInvalidParam, "past the allocation")
	_, _, err = ex.Export(1, 0, 8)
	require.ErrorIs(t, err, ErrInvalidParam)
	_, _, err = ex.Export(1, 0x30000000, 8)
	require.ErrorIs(t, err, ErrInvalidParam, "the driver's error for unknown memory")
	require.Zero(t, f.gets)
	im := NewIPCImporter(f)
	_, err = im.Resolve(1, IPCRef{Alloc: IPCAllocation{Base: 1, Size: 8}, Offset: 4}, 8)
	require.ErrorIs(t, err, ErrInvalidParam)
	require.ErrorIs(t, im.Handle(1, IPCMessage{Kind: 9, Alloc: IPCAllocation{Base: 1, Size: 8}}), ErrInvalidParam)
}

func TestIPCMessageDecode(t *testing.T) {
	m := IPCMessage{Kind: IPCExport, Alloc: IPCAllocation{Base: 0x1000, Size: 4096, BufferID: 7}}
	m.Handle[0], m.Handle[63] = 1, 2
	b, err := m.AppendBinary(nil)
	require.NoError(t, err)
	require.Len(t, b, ipcExportLen)
	got, err := DecodeIPCMessage(b)
	require.NoError(t, err)
	require.Equal(t, m, got)
	inv, err := IPCMessage{Kind: IPCInvalidate, Alloc: m.Alloc}.AppendBinary(nil)
	require.NoError(t, err)
	require.Len(t, inv, ipcInvalidateLen)
	for name, bad := range map[string][]byte{
		"empty":     nil,
		"truncated": b[:len(b)-1],
		"long":      append(append([]byte(nil), b...), 0),
		"version":   append([]byte{2}, b[1:]...),
		"kind":      append([]byte{1, 3}, b[2:]...),
		"zero base": append(append([]byte{1, IPCInvalidate}, make([]byte, 8)...), inv[10:]...),
		"wraps":     append([]byte{1, IPCInvalidate}, binary.LittleEndian.AppendUint64(binary.LittleEndian.AppendUint64(binary.LittleEndian.AppendUint64(nil, 1<<63), 1<<63), 1)...),
	} {
		_, err := DecodeIPCMessage(bad)
		require.ErrorIs(t, err, ErrBadIPCMessage, name)
		require.ErrorIs(t, err, ErrInvalidParam, name)
	}
	_, err = IPCMessage{Kind: 5, Alloc: m.Alloc}.AppendBinary(nil)
	require.ErrorIs(t, err, ErrInvalidParam)
}

// A peer's bytes reach the decoder: it must never panic, and what it accepts must
// encode back to the same bytes.
func FuzzDecodeIPCMessage(f *testing.F) {
	m := IPCMessage{Kind: IPCExport, Alloc: IPCAllocation{Base: 0x1000, Size: 4096, BufferID: 7}}
	b, _ := m.AppendBinary(nil)
	f.Add(b)
	inv, _ := IPCMessage{Kind: IPCInvalidate, Alloc: m.Alloc}.AppendBinary(nil)
	f.Add(inv)
	f.Add([]byte{1})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := DecodeIPCMessage(b)
		if err != nil {
			if !errors.Is(err, ErrInvalidParam) {
				t.Fatalf("error %v does not match ErrInvalidParam", err)
			}
			return
		}
		out, err := m.AppendBinary(nil)
		if err != nil {
			t.Fatalf("decoded %+v does not encode: %v", m, err)
		}
		if string(out) != string(b) {
			t.Fatalf("round trip: %x -> %x", b, out)
		}
	})
}
