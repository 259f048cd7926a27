package ucp

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/internal/testenv/fakeipc"
	"github.com/ucpx/ucpx/protocol"
)

// amInbox installs a handler for id on w that keeps every message for the test.
func amInbox(t *testing.T, w *Worker, id uint) <-chan *AmMessage {
	t.Helper()
	msgs := make(chan *AmMessage, 8)
	require.NoError(t, w.SetAmHandler(id, func(m *AmMessage) {
		m.Retain()
		msgs <- m
	}))
	return msgs
}

// amPullPair is an IPC pair whose A side progresses in the background, a context
// that ends with the test, and n bytes of fake device memory for each side.
func amPullPair(t *testing.T, n int) (p *pair, ctx context.Context, src, dst *fakeipc.Alloc) {
	t.Helper()
	p, _ = ipcPair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	t.Cleanup(background(p.a))
	src, dst = fakeipc.Malloc(n), fakeipc.Malloc(n)
	t.Cleanup(func() { src.Free(); dst.Free() })
	return p, ctx, src, dst
}

func nextMessage(t *testing.T, msgs <-chan *AmMessage) *AmMessage {
	t.Helper()
	select {
	case m := <-msgs:
		return m
	case <-time.After(10 * time.Second):
		t.Fatal("no active message")
		return nil
	}
}

// An active message of a device buffer to a peer IPC reaches carries no data: the
// receiver pulls it with RecvData, into device or host memory, and the send completes
// only once it did. One export and one mapping serve every message of an allocation;
// nothing is staged.
func TestAMPull(t *testing.T) {
	const size = 1 << 20
	p, ctx, src, dst := amPullPair(t, size)
	data := pattern(size, 3)
	copy(src.Bytes(), data)
	msgs := amInbox(t, p.b, 5)
	before := fakeipc.Stats()
	dev := &RequestParam{MemoryType: MemoryCUDA}
	for i, n := range []int{1, 4096, 64<<10 + 3, size - 4096} {
		off := 4096 * (i % 2)
		hdr := []byte{byte(i), 'h'}
		sr, err := p.epA.AmSendNbx(5, hdr, DeviceBuffer(src.Ptr()+uintptr(off), n), dev)
		require.NoError(t, err)
		m := nextMessage(t, msgs)
		require.True(t, m.IsRendezvous(), "the data waits in the sender's buffer")
		require.Equal(t, n, m.Length())
		require.Equal(t, hdr, m.Header)
		require.Nil(t, m.Data())
		time.Sleep(10 * time.Millisecond)
		require.False(t, sr.Done(), "the send completes once its receiver pulled")
		clear(dst.Bytes())
		rr, err := m.RecvData(DeviceBuffer(dst.Ptr(), n), dev)
		require.NoError(t, err)
		require.NoError(t, rr.Wait(ctx))
		require.Equal(t, n, rr.Length())
		require.Equal(t, checksum(data[off:off+n]), checksum(dst.Bytes()[:n]), "size %d", n)
		require.NoError(t, sr.Wait(ctx))
	}
	st := fakeipc.Stats()
	require.Equal(t, 1, st.Exports-before.Exports, "one export per allocation")
	require.Equal(t, 1, st.Opens-before.Opens, "one mapping per allocation")
	require.Zero(t, p.a.StagingStats().Bytes, "nothing staged")
	require.Zero(t, p.b.StagingStats().Bytes, "nothing staged")

	// Into host memory.
	sr, err := p.epA.AmSendNbx(5, nil, DeviceBuffer(src.Ptr(), 5000), dev)
	require.NoError(t, err)
	m := nextMessage(t, msgs)
	host := make([]byte, 5000)
	rr, err := m.RecvData(host, nil)
	require.NoError(t, err)
	require.NoError(t, rr.Wait(ctx))
	require.Equal(t, data[:5000], host)
	require.NoError(t, sr.Wait(ctx))

	// A buffer too small: refused at the call, the message stays; released, the send
	// completes without the data moving.
	sr, err = p.epA.AmSendNbx(5, nil, DeviceBuffer(src.Ptr(), 100), dev)
	require.NoError(t, err)
	m = nextMessage(t, msgs)
	_, err = m.RecvData(make([]byte, 99), nil)
	require.ErrorIs(t, err, ErrMessageTruncated)
	m.Release()
	require.NoError(t, sr.Wait(ctx))
	_, err = m.RecvData(make([]byte, 100), nil)
	require.ErrorIs(t, err, ErrClosed, "released")

	// No handler for the id: the message is dropped and the send completes.
	sr, err = p.epA.AmSendNbx(6, nil, DeviceBuffer(src.Ptr(), 100), dev)
	require.NoError(t, err)
	require.NoError(t, sr.Wait(ctx))

	// The id is ucpx's.
	_, err = p.epA.AmSendNbx(PullAM, nil, nil, nil)
	require.ErrorIs(t, err, ErrInvalidParam)
	require.ErrorIs(t, p.b.SetAmHandler(PullAM, func(*AmMessage) {}), ErrInvalidParam)

	// Flags beyond UCX's AM send flags are refused at the call (a pulled message's
	// descriptor carries ucpx's own flags beside them: a hello would have been dropped).
	for _, f := range []AmSendFlags{1 << 31, 1 << 30, 1 << 3} {
		dp := *dev
		dp.AmFlags = AmReply | f
		_, err = p.epA.AmSendNbx(5, nil, DeviceBuffer(src.Ptr(), 100), &dp)
		require.ErrorIs(t, err, ErrInvalidParam, "flags %#x", uint32(f))
	}
}

// StageAlways stages the device buffer instead; the receiver's RecvData into device
// memory then copies it in from staging (UCX cannot write device memory here).
func TestAMPullStageAlways(t *testing.T) {
	const n = 256 << 10
	p, ctx, src, dst := amPullPair(t, n)
	copy(src.Bytes(), pattern(n, 4))
	msgs := amInbox(t, p.b, 7)
	sr, err := p.epA.AmSendNbx(7, nil, DeviceBuffer(src.Ptr(), n), &RequestParam{MemoryType: MemoryCUDA, Staging: protocol.StageAlways})
	require.NoError(t, err)
	m := nextMessage(t, msgs)
	require.Nil(t, m.pull, "staged, not pulled")
	rr, err := m.RecvData(DeviceBuffer(dst.Ptr(), n), &RequestParam{MemoryType: MemoryCUDA})
	require.NoError(t, err)
	require.NoError(t, rr.Wait(ctx))
	require.NoError(t, sr.Wait(ctx))
	require.Equal(t, checksum(src.Bytes()), checksum(dst.Bytes()))
	require.NotZero(t, p.a.StagingStats().Bytes, "the sender staged")
	require.NotZero(t, p.b.StagingStats().Bytes, "the receiver copied in from staging")
}

// A send waiting for its receiver fails when its worker closes.
func TestAMPullSenderCloses(t *testing.T) {
	p, _ := ipcPair(t)
	src := fakeipc.Malloc(4096)
	defer src.Free()
	msgs := amInbox(t, p.b, 8)
	stop := background(p.a)
	sr, err := p.epA.AmSendNbx(8, nil, DeviceBuffer(src.Ptr(), 4096), &RequestParam{MemoryType: MemoryCUDA})
	require.NoError(t, err)
	m := nextMessage(t, msgs) // retained, never received
	stop()
	require.NoError(t, p.a.Close())
	require.True(t, sr.Done())
	require.ErrorIs(t, sr.Err(), ErrCanceled)
	m.Release()
}

// A pulled message whose length lies outside the allocation its key names (what a
// broken or hostile peer could send) never reaches the handler.
func TestAMPullLengthOutsideAllocation(t *testing.T) {
	const n = 4096
	p, _, src, _ := amPullPair(t, n)
	msgs := amInbox(t, p.b, 9)
	e, err := p.ctxA.pullKey(src.Ptr())
	require.NoError(t, err)
	self, err := p.a.pullAddress() // a well-formed sender: only the range is wrong
	require.NoError(t, err)
	for _, ref := range []*pullRef{{op: 1, off: 0, length: n + 1}, {op: 2, off: n + 8, length: 1}, {op: 3, off: 8, length: 1 << 62}} {
		h := p.ctxA.trust.seal.seal(pullMagic, p.ctxA.trust.id, encodePull(9, 0, ref.op, ref.off, ref.length, e.packed, self, nil))
		p.a.mu.Lock()
		_, err = p.a.postLocked("am_send_nbx", p.a.raw.AmSend(p.epA.raw, PullAM, bufPtr(h), len(h), nil, 0, 0, 0, -1, nil), &defaultParam, nil, bufPtr(h))
		p.a.mu.Unlock()
		require.NoError(t, err)
	}
	// A good one after them arrives: the bad ones were handled (dropped) first.
	sr, err := p.epA.AmSendNbx(9, nil, DeviceBuffer(src.Ptr(), n), &RequestParam{MemoryType: MemoryCUDA})
	require.NoError(t, err)
	m := nextMessage(t, msgs)
	require.Equal(t, n, m.Length(), "only the well-formed message reached the handler")
	m.Release()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, sr.Wait(ctx))
	select {
	case m := <-msgs:
		t.Fatalf("a message of %d bytes outside the allocation was delivered", m.Length())
	default:
	}
}
