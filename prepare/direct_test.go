package prepare_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/internal/testenv/fakeipc"
	"github.com/ucpx/ucpx/prepare"
	"github.com/ucpx/ucpx/stream"
	"github.com/ucpx/ucpx/ucp"
)

// The direct path on host streams: both contexts have the fake device of package
// fakeipc (its memory is C memory, its IPC maps in-process), so device buffers move
// by the same-host path without a GPU.

var fakeUUID = [16]byte{0xfa, 0x4e, 0xd1}

// ipcLink is shmLink with a fake device on both contexts.
func ipcLink(t testing.TB) (*link, *fakeipc.Device) {
	t.Helper()
	host, err := stream.Open(stream.Host)
	require.NoError(t, err)
	t.Cleanup(func() { _ = host.Close() })
	dev := fakeipc.New(host, fakeUUID)
	l := addressLink(t, ucp.ContextParams{Device: dev})
	return l, dev
}

// devicePair makes a prepared pair of fake device buffers of n bytes.
func devicePair(t testing.TB, l *link, dev *fakeipc.Device, n, sparts, rparts int, tag uint64) (send, recv *prepare.Request, sbuf, rbuf []byte) {
	t.Helper()
	sa, ra := fakeipc.Malloc(n), fakeipc.Malloc(n)
	sbuf, rbuf = sa.Bytes(), ra.Bytes()
	var err error
	send, err = prepare.PsendInit(l.s, sbuf, prepare.Params{Peer: l.toR, Tag: tag, Partitions: sparts, Backend: dev, MemoryType: ucp.MemoryCUDA})
	require.NoError(t, err)
	recv, err = prepare.PrecvInit(l.r, rbuf, prepare.Params{Peer: l.toS, Tag: tag, Partitions: rparts, Backend: dev, MemoryType: ucp.MemoryCUDA})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	require.NoError(t, prepare.PrepareAll(ctx, send, recv))
	t.Cleanup(func() {
		stop := progressWhile(l.s)
		_ = recv.Free() // revokes the buffer's key: the sender acknowledges
		stop()
		_ = send.Free()
		sa.Free()
		ra.Free()
	})
	return send, recv, sbuf, rbuf
}

func TestDirectPready(t *testing.T) {
	for _, tc := range []partCase{
		{name: "8x4K", n: 32 << 10, sp: 8, rp: 8, order: inOrder, iters: 50},
		{name: "4to16", n: 64 << 10, sp: 4, rp: 16, order: random(3), iters: 30},
		{name: "16to4", n: 64 << 10, sp: 16, rp: 4, order: reverse, iters: 30},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, dev := ipcLink(t)
			before := fakeipc.Stats()
			send, recv, sbuf, rbuf := devicePair(t, l, dev, tc.n, tc.sp, tc.rp, 3)
			require.True(t, prepare.Direct(send) && prepare.Direct(recv), "nothing staged")
			st := fakeipc.Stats()
			require.Equal(t, 2, st.Exports-before.Exports, "each buffer's allocation exported once")
			require.Equal(t, 1, st.Opens-before.Opens, "the sender maps the receiver's buffer once")
			require.Equal(t, 2, st.SharedMaps-before.SharedMaps, "the receiver's arrival counters and the sender's ready flags are each mapped once by the peer")
			iterate(t, send, recv, sbuf, rbuf, tc.iters, tc.order(tc.sp))
			tc.checkStats(t, send, recv)
			require.Equal(t, st.Opens, fakeipc.Stats().Opens, "no mapping per iteration")
		})
	}
}

// Partitions made ready in stream order and seen arriving in stream order; the
// device handles' host twins.
func TestDirectOnStreamsAndTwins(t *testing.T) {
	l, dev := ipcLink(t)
	const parts, size, iters = 8, 1024, 20
	send, recv, sbuf, rbuf := devicePair(t, l, dev, parts*size, parts, parts, 4)
	ss, err := dev.NewStream()
	require.NoError(t, err)
	defer ss.Close()
	rs, err := dev.NewStream()
	require.NoError(t, err)
	defer rs.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	onStreamIterations(ctx, t, send, recv, sbuf, rbuf, ss, rs, parts, size, iters)
	for i := iters + 1; i <= iters+10; i++ {
		require.NoError(t, twinIteration(ctx, send, recv, sbuf, rbuf, i, inOrder(parts)(i)))
	}
	require.Equal(t, uint64(iters+10), recv.Stats().Iterations)
}

// A failed peer releases a stream waiting for a partition of the direct path (the
// arrival counters are shared host memory the receiver's CPU stores into).
func TestDirectPeerFailureReleasesStream(t *testing.T) {
	l, dev := ipcLink(t)
	send, recv, _, _ := devicePair(t, l, dev, 4096, 2, 2, 5)
	_ = send
	rs, err := dev.NewStream()
	require.NoError(t, err)
	defer rs.Close()
	require.NoError(t, recv.Start())
	require.NoError(t, recv.ArrivedOnStream(rs, 1))
	released := make(chan struct{})
	require.NoError(t, rs.LaunchHostFunc(func() { close(released) }))
	select {
	case <-released:
		t.Fatal("released before any data or failure")
	case <-time.After(50 * time.Millisecond):
	}
	gone := errors.New("peer gone")
	prepare.Fail(recv, gone)
	select {
	case <-released:
	case <-time.After(10 * time.Second):
		t.Fatal("the stream stayed blocked after the peer failed")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.ErrorIs(t, recv.Wait(ctx), gone)
}

// PreadyNode on the direct path: the graph's own nodes move each partition (no
// engine, no put per launch), the arrival counter gets the iteration the receiver
// started; every launch is checked.
func TestDirectHostGraph(t *testing.T) {
	l, dev := ipcLink(t)
	const parts, size = 4, 512
	launches := 300
	if testing.Short() {
		launches = 50
	}
	send, recv, sbuf, rbuf := devicePair(t, l, dev, parts*size, parts, parts, 8)
	hostGraphLaunches(t, dev, send, recv, sbuf, rbuf, parts, size, launches)
	require.Equal(t, uint64(launches), recv.Stats().Iterations)
	require.Equal(t, uint64(parts), send.Stats().Puts, "one set of nodes per partition, nothing per launch")
}

// The kernel side of the direct path, played by the test on the fake device (its
// memory is host memory): the sender's handle names this side's buffer and the
// receiver's mapped buffer and counters, and making a partition ready is a copy, the
// flag marked moved, then the iteration into the counter, what ucpx_pready does on the
// GPU. The sender's Wait completes on the marks alone — before the receiver's Wait
// ran, in the same goroutine — and no ucpx operation moved anything.
func TestDirectKernelHandle(t *testing.T) {
	l, dev := ipcLink(t)
	const parts, size, iters = 4, 2048, 20
	send, recv, sbuf, rbuf := devicePair(t, l, dev, parts*size, parts, parts, 9)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	putsBefore := send.Stats().Puts
	for it := 1; it <= iters; it++ {
		require.NoError(t, recv.Start())
		require.NoError(t, send.Start())
		h, err := send.DeviceHandle()
		require.NoError(t, err)
		require.Zero(t, h.Triggers, "nothing to trigger on the direct path")
		require.NotZero(t, h.PeerBuf)
		require.NotZero(t, h.PeerWords)
		require.Equal(t, uintptr(unsafe.Pointer(&sbuf[0])), h.Buf)
		fill(sbuf, it)
		for p := range parts {
			flag := word(h.Words + uintptr(8*p))
			var v uint64
			for v = atomic.LoadUint64(flag); v == 0 || v>>63 != 0; v = atomic.LoadUint64(flag) {
				l.s.Progress() // the receiver's readiness is a UCX put
			}
			require.EqualValues(t, it, v, "the ready flag holds the iteration")
			atomic.StoreUint64(flag, 0)
			copy(ucp.DeviceBuffer(h.PeerBuf+uintptr(p*size), size), sbuf[p*size:(p+1)*size])
			atomic.StoreUint64(flag, 1<<63|v) // UCPX_PART_MOVED
			atomic.StoreUint64(word(h.PeerWords+uintptr(8*p)), v)
		}
		require.NoError(t, send.Wait(ctx))
		require.NoError(t, recv.Wait(ctx))
		require.NoError(t, checkFilled(rbuf, it))
	}
	require.Equal(t, uint64(iters), send.Stats().Iterations)
	require.Equal(t, putsBefore, send.Stats().Puts, "no put was issued: the kernel moved every partition")
}

// word is the 8-byte word at a fake device address (host memory).
func word(addr uintptr) *uint64 { return (*uint64)(unsafe.Pointer(&ucp.DeviceBuffer(addr, 8)[0])) }

// A device buffer sent to a host buffer, and a host buffer sent to a device buffer,
// on contexts with the fake device: each side decides alone, and ucp moves what the
// other side's key allows (staging the device side for the host receiver, copying
// into the mapped device buffer for the host sender). Partitions made ready together
// move as runs.
func TestDirectMixedSides(t *testing.T) {
	for _, tc := range []struct {
		name               string
		sendDev, recvDev   bool
		wantSend, wantRecv bool
	}{
		{"device to host", true, false, true, false},
		{"host to device", false, true, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, dev := ipcLink(t)
			const parts, size = 8, 1024
			buf := func(device bool) ([]byte, ucp.MemoryType) {
				if !device {
					return make([]byte, parts*size), ucp.MemoryHost
				}
				a := fakeipc.Malloc(parts * size)
				t.Cleanup(a.Free)
				return a.Bytes(), ucp.MemoryCUDA
			}
			sbuf, smt := buf(tc.sendDev)
			rbuf, rmt := buf(tc.recvDev)
			send, err := prepare.PsendInit(l.s, sbuf, prepare.Params{Peer: l.toR, Tag: 12, Partitions: parts, Backend: dev, MemoryType: smt})
			require.NoError(t, err)
			recv, err := prepare.PrecvInit(l.r, rbuf, prepare.Params{Peer: l.toS, Tag: 12, Partitions: parts / 2, Backend: dev, MemoryType: rmt})
			require.NoError(t, err)
			t.Cleanup(func() {
				stop := progressWhile(l.s)
				_ = recv.Free()
				stop()
				_ = send.Free()
			})
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			require.NoError(t, prepare.PrepareAll(ctx, send, recv))
			require.Equal(t, tc.wantSend, prepare.Direct(send))
			require.Equal(t, tc.wantRecv, prepare.Direct(recv))
			// In order: the partitions ready before the receiver's readiness move as
			// runs; reversed: one by one.
			iterate(t, send, recv, sbuf, rbuf, 5, reverse(parts))
			iterate(t, send, recv, sbuf, rbuf, 10, inOrder(parts))
		})
	}
}
