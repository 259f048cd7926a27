package ucp

import (
	"context"
	"encoding/binary"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/condition"
	"github.com/ucpx/ucpx/internal/testenv/fakeipc"
	"github.com/ucpx/ucpx/protocol"
	"github.com/ucpx/ucpx/stream"
)

var fakeUUID = [16]byte{0xfa, 0x4e, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14}

// ipcPair is a pair whose contexts both have the fake device (fakeipc): the whole
// same-host device path runs on host streams.
func ipcPair(t *testing.T) (*pair, *fakeipc.Device) {
	t.Helper()
	dev := fakeipc.New(hostBackend(t), fakeUUID)
	p, l, err := listenPair(t, ContextParams{Device: dev}, ContextParams{Device: dev})
	require.NoError(t, err)
	require.NoError(t, l.Close())
	// The exporter answers flushes and revocations as any UCX peer: it progresses.
	t.Cleanup(background(p.b))
	return p, dev
}

// deviceRegion allocates fake device memory in b's context and packs a region of it.
func deviceRegion(t *testing.T, c *Context, alloc *fakeipc.Alloc, off, n int) (*MemH, []byte) {
	t.Helper()
	m, err := c.MemMapPtr(alloc.Ptr()+uintptr(off), n, MemoryCUDA)
	require.NoError(t, err)
	require.Nil(t, m.Bytes(), "device memory has no host view")
	packed, err := m.PackRkey()
	require.NoError(t, err)
	return m, packed
}

// mappedRegion allocates n bytes of fake device memory, registers them in B's context
// and unpacks the key at A. At the end of the test the region is closed (revoking the
// key, with A progressing) and the memory freed.
func mappedRegion(t *testing.T, p *pair, n int) (*fakeipc.Alloc, *MemH, *Rkey) {
	t.Helper()
	alloc := fakeipc.Malloc(n)
	m, packed := deviceRegion(t, p.ctxB, alloc, 0, n)
	rk, err := p.epA.UnpackRkey(packed)
	require.NoError(t, err)
	t.Cleanup(func() {
		stop := background(p.a)
		_ = m.Close() // ErrClosed where the test closed it
		stop()
		alloc.Free()
	})
	return alloc, m, rk
}

func TestIPCPutGet(t *testing.T) {
	p, _ := ipcPair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	alloc := fakeipc.Malloc(1 << 20)
	defer alloc.Free()
	before := fakeipc.Stats()
	const off, n = 4096, 64 << 10
	m, packed := deviceRegion(t, p.ctxB, alloc, off, n)
	// A second region of the same allocation: no second export, no second mapping.
	m2, packed2 := deviceRegion(t, p.ctxB, alloc, off+n, n)
	rk, err := p.epA.UnpackRkey(packed)
	require.NoError(t, err)
	require.True(t, rk.Device())
	rk2, err := p.epA.UnpackRkey(packed2)
	require.NoError(t, err)
	st := fakeipc.Stats()
	require.Equal(t, 1, st.Exports-before.Exports, "one handle per allocation")
	require.Equal(t, 1, st.Opens-before.Opens, "one mapping per allocation")

	src := pattern(n, 1)
	r, err := p.epA.PutNbx(src, rk.Base(), rk, nil)
	require.NoError(t, err)
	require.NoError(t, r.Wait(ctx))
	require.Equal(t, checksum(src), checksum(alloc.Bytes()[off:off+n]), "put landed in the peer's device memory")

	src2 := pattern(1000, 2)
	r, err = p.epA.PutNbx(src2, rk2.Base()+17, rk2, nil)
	require.NoError(t, err)
	back := make([]byte, 1000)
	g, err := p.epA.GetNbx(back, rk2.Base()+17, rk2, nil)
	require.NoError(t, err)
	// The get runs after the put on the worker's stream.
	require.NoError(t, g.Wait(ctx))
	require.NoError(t, r.Wait(ctx))
	require.Equal(t, src2, back)

	// Flush waits for every copy issued before it; callbacks run.
	var called int
	var puts []*Request
	for i := range 8 {
		r, err := p.epA.PutNbx(pattern(4096, int64(10+i)), rk.Base()+uint64(i*4096), rk, &RequestParam{Callback: func(*Request) { called++ }})
		require.NoError(t, err)
		puts = append(puts, r)
	}
	f, err := p.epA.FlushNbx(nil)
	require.NoError(t, err)
	require.NoError(t, f.Wait(ctx))
	for i, r := range puts {
		require.True(t, r.Done(), "put %d done once the flush is", i)
		require.Equal(t, pattern(4096, int64(10+i)), alloc.Bytes()[off+i*4096:off+(i+1)*4096])
	}
	require.Equal(t, 8, called)

	// Out of the region: at the call.
	_, err = p.epA.PutNbx(src, rk.Base()+1, rk, nil)
	require.ErrorIs(t, err, ErrOutOfRange)
	_, err = p.epA.GetNbx(back, rk2.Base()+uint64(n)-10, rk2, nil)
	require.ErrorIs(t, err, ErrOutOfRange)

	// Closing both keys unmaps the allocation (once, after the last).
	require.NoError(t, rk.Close())
	require.NoError(t, rk2.Close())
	require.Eventually(t, func() bool { return fakeipc.Stats().Closes-before.Closes == 1 }, 5*time.Second, time.Millisecond)
	stop := background(p.a)
	require.NoError(t, m.Close())
	require.NoError(t, m2.Close())
	stop()
}

// Under a Stream condition on a stream of the device's kind the copy is enqueued on
// the stream itself: later work on the stream sees the data, and no engine runs.
func TestIPCOnStream(t *testing.T) {
	p, dev := ipcPair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	alloc, _, rk := mappedRegion(t, p, 1<<20)
	s, sc := streamCondition(t, dev)

	// The stream is held back: nothing may move before it gets there.
	gate := make(chan struct{})
	require.NoError(t, s.LaunchHostFunc(func() { <-gate }))
	src := pattern(256<<10, 3)
	r, err := p.epA.PutNbx(src, rk.Base(), rk, &RequestParam{Condition: sc})
	require.NoError(t, err)
	back := make([]byte, 256<<10)
	g, err := p.epA.GetNbx(back, rk.Base(), rk, &RequestParam{Condition: sc})
	require.NoError(t, err)
	seen := make(chan uint32, 1)
	require.NoError(t, s.LaunchHostFunc(func() { seen <- checksum(back) }))
	time.Sleep(10 * time.Millisecond)
	require.False(t, r.Done())
	ok, err := r.Test()
	require.NoError(t, err)
	require.False(t, ok, "the copy waits for its stream")
	require.Zero(t, alloc.Bytes()[0])
	close(gate)
	require.Equal(t, checksum(src), <-seen, "work after the get on the stream sees the data")
	require.NoError(t, r.Wait(ctx))
	require.NoError(t, g.Wait(ctx))
	require.Nil(t, p.a.eng, "the stream path needs no engine")

	// Non-blocking: the stream does not wait for the copy; WaitOnStream orders it.
	src2 := pattern(64<<10, 4)
	r, err = p.epA.PutNbx(src2, rk.Base()+8, rk, &RequestParam{Condition: sc, Flags: NonBlockingEnqueue})
	require.NoError(t, err)
	require.NoError(t, r.WaitOnStream(s))
	require.NoError(t, s.LaunchHostFunc(func() { seen <- checksum(alloc.Bytes()[8 : 8+64<<10]) }))
	require.Equal(t, checksum(src2), <-seen)
	require.NoError(t, r.Wait(ctx))
}

// A declared device buffer under a Stream condition: the copy checks for stream
// capture in its own driver call (CopyDeviceUncaptured) and is enqueued on the stream
// in order, a put and a get alike.
func TestIPCOnStreamDeclaredDevice(t *testing.T) {
	p, dev := ipcPair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const n = 128 << 10
	alloc, rk, local, s, sc := deviceCopyRig(t, p, dev, pattern(n, 9))
	before := fakeipc.Stats()
	gate := make(chan struct{})
	var open sync.Once
	defer open.Do(func() { close(gate) })
	require.NoError(t, s.LaunchHostFunc(func() { <-gate }))
	r, err := p.epA.PutNbx(DeviceBuffer(local.Ptr(), n), rk.Base(), rk, &RequestParam{Condition: sc, MemoryType: MemoryCUDA})
	require.NoError(t, err)
	g, err := p.epA.GetNbx(DeviceBuffer(local.Ptr()+n, n), rk.Base(), rk, &RequestParam{Condition: sc, MemoryType: MemoryCUDA})
	require.NoError(t, err)
	require.False(t, r.Done(), "the copy waits for its stream")
	require.Zero(t, alloc.Bytes()[0])
	open.Do(func() { close(gate) })
	require.NoError(t, r.Wait(ctx))
	require.NoError(t, g.Wait(ctx))
	require.Equal(t, checksum(pattern(n, 9)), checksum(alloc.Bytes()[:n]))
	require.Equal(t, checksum(pattern(n, 9)), checksum(local.Bytes()[n:2*n]), "the get ran after the put on the stream")
	after := fakeipc.Stats()
	require.Equal(t, 2, after.DeviceCopies-before.DeviceCopies, "device-to-device copies")
	require.Equal(t, 2, after.SameDeviceCopies-before.SameDeviceCopies, "both sides on one device: the backend may copy by kernel")
	require.Nil(t, p.a.eng, "the stream path needs no engine")
}

// deviceCopyRig is what a device-buffer copy test starts from: a 1 MiB region of B's
// mapped at A (alloc, rk), A's 1 MiB device buffer beginning with data (freed when the
// test ends), and a Stream condition on dev.
func deviceCopyRig(t *testing.T, p *pair, dev stream.Backend, data []byte) (*fakeipc.Alloc, *Rkey, *fakeipc.Alloc, stream.Stream, *condition.Condition) {
	t.Helper()
	alloc, _, rk := mappedRegion(t, p, 1<<20)
	local := fakeipc.Malloc(1 << 20)
	t.Cleanup(local.Free)
	s, sc := streamCondition(t, dev)
	copy(local.Bytes(), data)
	return alloc, rk, local, s, sc
}

// Peers on two devices with peer access: the copies go through, and the backend is
// not told they are on one device (its copy kernel is only for one device's memory).
func TestIPCPeerDeviceCopies(t *testing.T) {
	other := fakeUUID
	other[15]++
	devA, devB := fakeipc.New(hostBackend(t), fakeUUID), fakeipc.New(hostBackend(t), other)
	devA.GrantPeerAccess(other)
	devB.GrantPeerAccess(fakeUUID)
	p, l, err := listenPair(t, ContextParams{Device: devA}, ContextParams{Device: devB})
	require.NoError(t, err)
	require.NoError(t, l.Close())
	t.Cleanup(background(p.b))
	require.Equal(t, protocol.ReachPeerDevice, p.epA.Reach(devA.CanAccessPeer))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const n = 96 << 10
	alloc, rk, local, s, sc := deviceCopyRig(t, p, devA, pattern(n, 4))
	before := fakeipc.Stats()
	r, err := p.epA.PutNbx(DeviceBuffer(local.Ptr(), n), rk.Base()+8, rk, &RequestParam{Condition: sc, MemoryType: MemoryCUDA})
	require.NoError(t, err)
	require.NoError(t, r.Wait(ctx))
	g, err := p.epA.GetNbx(DeviceBuffer(local.Ptr()+n, n), rk.Base()+8, rk, &RequestParam{MemoryType: MemoryCUDA})
	require.NoError(t, err)
	require.NoError(t, g.Wait(ctx))
	require.NoError(t, s.Synchronize())
	require.Equal(t, checksum(pattern(n, 4)), checksum(alloc.Bytes()[8:8+n]))
	require.Equal(t, checksum(pattern(n, 4)), checksum(local.Bytes()[n:2*n]))
	after := fakeipc.Stats()
	require.Equal(t, 2, after.DeviceCopies-before.DeviceCopies, "device-to-device copies")
	require.Zero(t, after.SameDeviceCopies-before.SameDeviceCopies, "two devices: the copy engine's copies")
}

// Under conditions whose streams cannot copy (a kernel-triggered condition here) the
// engine issues the copy at the trigger; nothing is staged.
func TestIPCKernelTriggered(t *testing.T) {
	p, _ := ipcPair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	alloc, _, rk := mappedRegion(t, p, 64<<10)
	kc, trigger := kernelCondition(t)
	src := pattern(64<<10, 5)
	r, err := p.epA.PutNbx(src, rk.Base(), rk, &RequestParam{Condition: kc, MemoryType: MemoryCUDA})
	require.NoError(t, err)
	time.Sleep(10 * time.Millisecond)
	require.False(t, r.Done(), "ran before its trigger")
	trigger()
	require.NoError(t, r.Wait(ctx))
	require.Equal(t, checksum(src), checksum(alloc.Bytes()))
	require.Zero(t, p.a.StagingStats().Bytes, "nothing staged")
}

// The exporter's MemH.Close revokes the key: the importer unmaps the allocation
// before it acknowledges, and later operations on the key fail.
func TestIPCRevokeUnmaps(t *testing.T) {
	p, _ := ipcPair(t)
	alloc := fakeipc.Malloc(64 << 10)
	defer alloc.Free()
	m, packed := deviceRegion(t, p.ctxB, alloc, 0, 64<<10)
	rk, err := p.epA.UnpackRkey(packed)
	require.NoError(t, err)
	before := fakeipc.Stats()
	stop := background(p.a)
	require.NoError(t, m.Close())
	stop()
	require.Equal(t, 1, fakeipc.Stats().Closes-before.Closes, "unmapped before the exporter's Close returned")
	_, err = p.epA.PutNbx(pattern(8, 1), rk.Base(), rk, nil)
	require.ErrorIs(t, err, ErrRevoked)
	require.NoError(t, rk.Close())
	require.Equal(t, 1, fakeipc.Stats().Closes-before.Closes, "no second unmap")
}

func TestIPCRefusals(t *testing.T) {
	dev := fakeipc.New(hostBackend(t), fakeUUID)
	// A Device that cannot map memory across processes.
	_, err := NewContext(ContextParams{Device: hostBackend(t)})
	require.ErrorIs(t, err, ErrInvalidParam)

	// A exports a device region; B has no Device and cannot map it.
	p, l, err := listenPair(t, ContextParams{Device: dev}, ContextParams{})
	require.NoError(t, err)
	require.NoError(t, l.Close())
	alloc := fakeipc.Malloc(4096)
	defer alloc.Free()
	_, err = p.ctxB.MemMapPtr(alloc.Ptr(), 4096, MemoryCUDA)
	require.ErrorIs(t, err, ErrUnsupported, "device memory without Device")
	m, packed := deviceRegion(t, p.ctxA, alloc, 0, 4096)
	defer m.Close()
	_, err = p.epB.UnpackRkey(packed)
	require.ErrorIs(t, err, ErrUnsupported)
	// Memory the device does not know.
	_, err = p.ctxA.MemMapPtr(alloc.Ptr()+8192, 16, MemoryCUDA)
	require.ErrorIs(t, err, ErrInvalidParam)
	_, err = p.ctxA.MemMapPtr(alloc.Ptr()+4000, 200, MemoryCUDA)
	require.ErrorIs(t, err, ErrInvalidParam, "past the allocation's end")

	// A device region's key with a region outside its allocation is refused, sealed
	// or not (openRkey checks what the exporter's seal covers too).
	msg := protocol.IPCMessage{Kind: protocol.IPCExport, Alloc: protocol.IPCAllocation{Base: 0x10000, Size: 4096, BufferID: 1}}
	_, err = decodeIPCPayload(ipcPayload(msg), 0x10000+4000, 200)
	require.ErrorIs(t, err, ErrInvalidParam)
	_, err = decodeIPCPayload(ipcPayload(msg), 0x10000, 4096)
	require.NoError(t, err)
}

// Put with signal on device regions: the copy, then the peer's mapped word written
// in stream order; a stream of the peer waiting on the word sees the data.
func TestIPCPutSignal(t *testing.T) {
	p, dev := ipcPair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	alloc := fakeipc.Malloc(64 << 10)
	defer alloc.Free()
	words := fakeipc.Malloc(64)
	defer words.Free()
	m, packed := deviceRegion(t, p.ctxB, alloc, 0, 64<<10)
	wm, wpacked := deviceRegion(t, p.ctxB, words, 0, 64)
	rk, err := p.epA.UnpackRkey(packed)
	require.NoError(t, err)
	wk, err := p.epA.UnpackRkey(wpacked)
	require.NoError(t, err)

	// The peer's stream waits for the word, then reads the data.
	sb, err := dev.NewStream()
	require.NoError(t, err)
	defer sb.Close()
	require.NoError(t, dev.WaitValueAt(sb, words.Ptr()+8, 7, stream.GEQ))
	seen := make(chan uint32, 1)
	require.NoError(t, sb.LaunchHostFunc(func() { seen <- checksum(alloc.Bytes()[:32<<10]) }))

	sa, sc := streamCondition(t, dev)
	src := pattern(32<<10, 9)
	r, err := p.epA.PutSignalNbx(src, rk.Base(), rk, Signal{Op: SignalSet, Value: 7, Addr: wk.Base() + 8, Rkey: wk}, &RequestParam{Condition: sc})
	require.NoError(t, err)
	require.Equal(t, checksum(src), <-seen)
	require.NoError(t, r.Wait(ctx))
	require.NoError(t, sa.Synchronize())

	// Without a condition, on the worker's stream.
	r, err = p.epA.PutSignalNbx(pattern(100, 10), rk.Base()+64, rk, Signal{Op: SignalStore, Value: 9, Addr: wk.Base(), Rkey: wk}, nil)
	require.NoError(t, err)
	require.NoError(t, r.Wait(ctx))
	require.Equal(t, pattern(100, 10), alloc.Bytes()[64:164])
	require.EqualValues(t, 9, binary.NativeEndian.Uint64(words.Bytes()))

	// Refusals at the call.
	_, err = p.epA.PutSignalNbx(src, rk.Base(), rk, Signal{Op: SignalAdd, Value: 1, Addr: wk.Base(), Rkey: wk}, nil)
	require.ErrorIs(t, err, ErrUnsupported, "no stream add")
	_, err = p.epA.PutSignalNbx(src, rk.Base(), rk, Signal{Op: SignalSet, Value: 1, Addr: wk.Base() + 4, Rkey: wk}, nil)
	require.ErrorIs(t, err, ErrInvalidParam, "unaligned word")
	_, err = p.epA.PutSignalNbx(src, rk.Base(), rk, Signal{Op: SignalSet, Value: 1, Addr: wk.Base() + 64, Rkey: wk}, nil)
	require.ErrorIs(t, err, ErrOutOfRange)
	host, err := p.ctxB.MemAlloc(64)
	require.NoError(t, err)
	hpacked, err := host.PackRkey()
	require.NoError(t, err)
	hk, err := p.epA.UnpackRkey(hpacked)
	require.NoError(t, err)
	_, err = p.epA.PutSignalNbx(src, rk.Base(), rk, Signal{Op: SignalSet, Value: 1, Addr: hk.Base(), Rkey: hk}, nil)
	require.ErrorIs(t, err, ErrUnsupported, "device data with a host word")

	// DeviceAddress: the mapping, for graph nodes and kernels.
	addr, err := rk.DeviceAddress(rk.Base()+100, 10)
	require.NoError(t, err)
	require.Equal(t, alloc.Ptr()+100, addr, "the fake maps at the allocation's own address")
	_, err = rk.DeviceAddress(rk.Base()+100, 64<<10)
	require.ErrorIs(t, err, ErrOutOfRange)
	_, err = hk.DeviceAddress(hk.Base(), 8)
	require.ErrorIs(t, err, ErrUnsupported)

	stop := background(p.a)
	require.NoError(t, host.Close())
	require.NoError(t, m.Close())
	require.NoError(t, wm.Close())
	stop()
	_, err = rk.DeviceAddress(rk.Base(), 8)
	require.ErrorIs(t, err, ErrRevoked)
}

// Copies of different streams complete independently: a stream held back with many
// copies queued does not hold back the completion of another stream's copy.
func TestIPCStreamsCompleteIndependently(t *testing.T) {
	p, dev := ipcPair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	alloc, _, rk := mappedRegion(t, p, 64<<10)
	sa, ca := streamCondition(t, dev)
	_, cb := streamCondition(t, dev)
	gate := make(chan struct{})
	require.NoError(t, sa.LaunchHostFunc(func() { <-gate }))
	var held []*Request
	for i := range 8 {
		r, err := p.epA.PutNbx(pattern(1024, int64(i)), rk.Base()+uint64(i*1024), rk, &RequestParam{Condition: ca})
		require.NoError(t, err)
		held = append(held, r)
	}
	r, err := p.epA.PutNbx(pattern(1024, 99), rk.Base()+32<<10, rk, &RequestParam{Condition: cb})
	require.NoError(t, err)
	require.NoError(t, r.Wait(ctx), "the other stream's copy completes while the first stream is held")
	require.Equal(t, pattern(1024, 99), alloc.Bytes()[32<<10:33<<10])
	for _, h := range held {
		require.False(t, h.Done())
	}
	close(gate)
	for _, h := range held {
		require.NoError(t, h.Wait(ctx))
	}
}

// Most copies on a stream record no event of their own: each completes with the next
// event after it on its stream, which progress records when it finds none. A loop on
// Progress sees them all done; WaitOnStream and a flush order after any of them.
func TestIPCCopiesCompleteWithoutOwnEvents(t *testing.T) {
	p, dev := ipcPair(t)
	alloc, _, rk := mappedRegion(t, p, 64<<10)
	s, sc := streamCondition(t, dev)
	gate := make(chan struct{})
	require.NoError(t, s.LaunchHostFunc(func() { <-gate }))
	var reqs []*Request
	for i := range 21 {
		r, err := p.epA.PutNbx(pattern(1024, int64(i)), rk.Base()+uint64(i*1024), rk, &RequestParam{Condition: sc})
		require.NoError(t, err)
		reqs = append(reqs, r)
	}
	// A stream ordered after the 5th copy (no event of its own) sees its data.
	s2, err := dev.NewStream()
	require.NoError(t, err)
	defer s2.Close()
	require.NoError(t, reqs[4].WaitOnStream(s2))
	seen := make(chan []byte, 1)
	require.NoError(t, s2.LaunchHostFunc(func() { seen <- append([]byte(nil), alloc.Bytes()[4096:5120]...) }))
	f, err := p.epA.FlushNbx(nil)
	require.NoError(t, err)
	require.False(t, f.Done())
	close(gate)
	require.Equal(t, pattern(1024, 4), <-seen)
	deadline := time.Now().Add(10 * time.Second)
	for _, r := range reqs {
		for !r.Done() {
			require.True(t, time.Now().Before(deadline), "a copy never completed")
			p.a.Progress()
		}
		require.NoError(t, r.Err())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, f.Wait(ctx))
	for i := range 21 {
		require.Equal(t, pattern(1024, int64(i)), alloc.Bytes()[i*1024:(i+1)*1024])
	}
}

// heldImport maps n bytes of fake device memory of B's at A, once B counts the
// import, with A's device busy (its IPC side stream held) until open is called, at
// the latest when the test ends (before the worker's Close waits for the stream).
// Freeing the memory is the caller's.
func heldImport(t *testing.T, p *pair, n int) (alloc *fakeipc.Alloc, m *MemH, rk *Rkey, open func()) {
	t.Helper()
	alloc = fakeipc.Malloc(n)
	m, packed := deviceRegion(t, p.ctxB, alloc, 0, n)
	rk, err := p.epA.UnpackRkey(packed)
	require.NoError(t, err)
	waitImported(t, m, p.ctxA, 1)
	s, err := p.a.ipcSideStream()
	require.NoError(t, err)
	gate := make(chan struct{})
	open = sync.OnceFunc(func() { close(gate) })
	t.Cleanup(open)
	require.NoError(t, s.LaunchHostFunc(func() { <-gate }))
	return alloc, m, rk, open
}

// Closing a key with a copy still queued keeps its mapping, and the exporter's count
// of it, until the copy ran: the exporter's MemH.Close waits for the copy, and the
// memory freed after it is never written.
func TestIPCRkeyCloseWaitsForQueuedCopies(t *testing.T) {
	inRevokeModes(t, func(t *testing.T) {
		p, _ := ipcPair(t)
		t.Cleanup(background(p.a))
		const n = 4096
		alloc, m, rk, open := heldImport(t, p, n)
		r, err := p.epA.PutNbx(pattern(n, 4), rk.Base(), rk, nil)
		require.NoError(t, err)
		require.NoError(t, rk.Close())
		_, err = p.epA.PutNbx(pattern(n, 4), rk.Base(), rk, nil)
		require.ErrorIs(t, err, ErrClosed)

		time.AfterFunc(100*time.Millisecond, open)
		require.NoError(t, m.Close())
		done := r.Done()
		mapped := fakeipc.Mapped(alloc.Ptr())
		alloc.Free() // what the exporter does next
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		require.NoError(t, r.Wait(ctx))
		require.True(t, done, "the exporter's Close returned with a copy into its memory still queued")
		require.Zero(t, mapped)
	})
}

// The importer closes its endpoint with a copy still queued, then the exporter
// revokes the region: a closed endpoint is no proof that nothing is in flight
// (CloseNbx does not wait for IPC copies), so the importer keeps the mapping, and the
// exporter's Close does not return, until the copy ran. Before, the revocation
// unmapped and acknowledged at once, and (in-process) MemH.Close returned nil while
// the copy was still to write into the memory it let the caller free.
func TestIPCRevokeAfterEndpointCloseWaitsForQueuedCopies(t *testing.T) {
	inRevokeModes(t, func(t *testing.T) {
		p, _ := ipcPair(t)
		const n = 4096
		alloc, m, rk, open := heldImport(t, p, n)
		defer alloc.Free()
		r, err := p.epA.PutNbx(pattern(n, 7), rk.Base(), rk, nil)
		require.NoError(t, err)
		cr, err := p.epA.CloseNbx(false)
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		require.NoError(t, cr.Wait(ctx))
		require.False(t, r.Done(), "the copy is held on the stream")
		t.Cleanup(background(p.a))
		closed := make(chan error, 1)
		go func() { closed <- m.Close() }()
		time.Sleep(300 * time.Millisecond)
		mapped := fakeipc.Mapped(alloc.Ptr())
		select {
		case err := <-closed:
			open()
			_ = r.Wait(ctx) // before the memory is freed
			t.Fatalf("the exporter's Close returned (%v) with a copy into its memory still queued", err)
		default:
		}
		require.Equal(t, 1, mapped, "unmapped with a copy through the mapping still queued")
		open()
		err = <-closed
		done := r.Done()
		require.NoError(t, r.Wait(ctx))
		require.Equal(t, pattern(n, 7), alloc.Bytes())
		if revokeInProcess {
			require.NoError(t, err)
		} else if err != nil {
			// The acknowledgement has no endpoint to go on: the memory stays
			// registered, which is safe.
			t.Logf("exporter's Close: %v", err)
		}
		if err == nil {
			require.True(t, done, "the exporter's Close returned with a copy into its memory still queued")
			require.Zero(t, fakeipc.Mapped(alloc.Ptr()))
		}
	})
}

// Worker.Close fails a copy still held on its stream past Close's bound (ErrCanceled),
// but the copy may still run: the key's mapping stays, and the exporter's revocation
// waits, until it ran. Before, Close unmapped with the copy still queued and told the
// exporter the key was released: the exporter's MemH.Close returned nil at once and
// the copy then wrote into the memory it let the caller free.
func TestIPCWorkerCloseKeepsMappingsOfAbandonedCopies(t *testing.T) {
	// In-process revocation: by messages, the exporter sees the importer's endpoints
	// fail with its worker and takes it for dead (nothing there tells a closed worker
	// from a dead process).
	old := revokeInProcess
	revokeInProcess = true
	defer func() { revokeInProcess = old }()
	p, _ := ipcPair(t)
	const n = 4096
	alloc, m, rk, open := heldImport(t, p, n)
	defer alloc.Free()
	r, err := p.epA.PutNbx(pattern(n, 9), rk.Base(), rk, nil)
	require.NoError(t, err)
	closed := make(chan error, 1)
	go func() { closed <- p.a.Close() }() // (the fake's stream close waits for the held work)
	require.Eventually(t, r.Done, 10*time.Second, time.Millisecond, "Close fails the copy past its bound")
	require.ErrorIs(t, r.Err(), ErrCanceled)
	time.Sleep(50 * time.Millisecond)
	mapped := fakeipc.Mapped(alloc.Ptr())
	mclosed := make(chan error, 1)
	go func() { mclosed <- m.Close() }()
	var early error
	returned := false
	select {
	case early = <-mclosed:
		returned = true
	case <-time.After(300 * time.Millisecond):
	}
	copied := string(alloc.Bytes()) == string(pattern(n, 9))
	open()
	require.NoError(t, <-closed)
	require.Equal(t, 1, mapped, "unmapped with an abandoned copy through the mapping still queued")
	require.False(t, returned && early == nil && !copied, "the exporter's Close returned with a copy into its memory still queued")
	merr := early
	if !returned {
		merr = <-mclosed
	}
	require.Equal(t, pattern(n, 9), alloc.Bytes(), "the abandoned copy ran")
	require.NoError(t, merr, "acknowledged once the copy ran and the mapping was released")
	require.Eventually(t, func() bool { return fakeipc.Mapped(alloc.Ptr()) == 0 }, 5*time.Second, time.Millisecond)
}

// A zero-length put or get on a device region's key is checked as any other: on a
// closed key it fails with ErrClosed (before, it succeeded), and on a closed endpoint
// with ErrClosed.
func TestIPCZeroLengthChecksKeyAndEndpoint(t *testing.T) {
	p, _ := ipcPair(t)
	_, _, rk := mappedRegion(t, p, 4096)
	_, _, rk2 := mappedRegion(t, p, 4096)
	r, err := p.epA.PutNbx(nil, rk.Base(), rk, nil)
	require.NoError(t, err)
	require.True(t, r.Done())
	require.NoError(t, rk.Close())
	_, err = p.epA.PutNbx(nil, rk.Base(), rk, nil)
	require.ErrorIs(t, err, ErrClosed)
	_, err = p.epA.GetNbx(nil, rk.Base(), rk, nil)
	require.ErrorIs(t, err, ErrClosed)
	_, err = p.epA.CloseNbx(false)
	require.NoError(t, err)
	_, err = p.epA.PutNbx(nil, rk2.Base(), rk2, nil)
	require.ErrorIs(t, err, ErrClosed)
}

// A zero-length put or get on a device region's key honours NoImmediateCompletion (a
// pending Request whose Callback runs; before, a done one whose Callback never ran)
// and a caller's RequestParam.Request.
func TestIPCZeroLengthRequestAndCallback(t *testing.T) {
	p, _ := ipcPair(t)
	_, _, rk := mappedRegion(t, p, 4096)
	called := make(chan *Request, 2)
	cb := func(r *Request) { called <- r }
	r, err := p.epA.PutNbx(nil, rk.Base(), rk, &RequestParam{Flags: NoImmediateCompletion, Callback: cb})
	require.NoError(t, err)
	require.False(t, r.Done(), "NoImmediateCompletion: a pending Request")
	progressAll(t, 5*time.Second, r.Done, p.a)
	require.NoError(t, r.Err())
	select {
	case got := <-called:
		require.Same(t, r, got)
	case <-time.After(5 * time.Second):
		t.Fatal("the Callback of a zero-length IPC put never ran")
	}
	mine := new(Request)
	r, err = p.epA.GetNbx(nil, rk.Base(), rk, &RequestParam{Request: mine})
	require.NoError(t, err)
	require.Same(t, mine, r)
	require.True(t, r.Done())
	r, err = p.epA.GetNbx(nil, rk.Base(), rk, &RequestParam{Request: mine, Flags: NoImmediateCompletion, Callback: cb})
	require.NoError(t, err)
	require.Same(t, mine, r)
	progressAll(t, 5*time.Second, r.Done, p.a)
	select {
	case got := <-called:
		require.Same(t, mine, got)
	case <-time.After(5 * time.Second):
		t.Fatal("the Callback of a zero-length IPC get never ran")
	}
}

// A key closed with a copy queued is unmapped, and its exporter told, once the copy
// completed: the exporter's Close then has nobody to wait for.
func TestIPCRkeyCloseReleasesAfterCopies(t *testing.T) {
	inRevokeModes(t, func(t *testing.T) {
		p, _ := ipcPair(t)
		const n = 4096
		alloc, m, rk, open := heldImport(t, p, n)
		defer alloc.Free()
		r, err := p.epA.PutNbx(pattern(n, 5), rk.Base(), rk, nil)
		require.NoError(t, err)
		require.NoError(t, rk.Close())
		for range 100 {
			p.a.Progress()
		}
		require.Equal(t, 1, fakeipc.Mapped(alloc.Ptr()), "unmapped with the copy queued")
		open()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		require.NoError(t, r.Wait(ctx))
		require.Equal(t, pattern(n, 5), alloc.Bytes())
		progressAll(t, 5*time.Second, func() bool { return fakeipc.Mapped(alloc.Ptr()) == 0 }, p.a)
		require.Eventually(t, func() bool { // the release notice arrived
			p.ctxB.mu.Lock()
			defer p.ctxB.mu.Unlock()
			for _, imp := range m.importers { // one elsewhere stays, holding none
				if imp.count > 0 {
					return false
				}
			}
			return true
		}, 5*time.Second, time.Millisecond)
		p.ctxB.revokeTimeout = 100 * time.Millisecond
		require.NoError(t, m.Close(), "A does not progress: nobody to wait for")
	})
}
