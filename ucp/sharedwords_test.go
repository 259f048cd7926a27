package ucp

import (
	"context"
	"encoding/binary"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/internal/testenv/fakeipc"
	"github.com/ucpx/ucpx/protocol"
	"github.com/ucpx/ucpx/stream"
)

// Signals of a context with a Device live in shared memory that a same-host peer
// maps: its put-with-signal into a device region writes the word from the stream,
// and the words stay host memory the owner's CPU and streams read.
func TestSharedSignalWords(t *testing.T) {
	p, dev := ipcPair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	before := fakeipc.Stats()
	alloc, _, rk := mappedRegion(t, p, 64<<10)

	words, packed := peerSignals(t, p, dev, 4)
	wk, err := p.epA.UnpackRkey(packed)
	require.NoError(t, err)
	st := fakeipc.Stats()
	require.Equal(t, 1, st.SharedAllocs-before.SharedAllocs, "the words are shared")
	require.Equal(t, 1, st.SharedMaps-before.SharedMaps, "the peer mapped them once")
	addr, err := wk.DeviceAddress(wk.Base()+16, 8)
	require.NoError(t, err)
	require.NotEqual(t, words.Word(2).HostPtr(), addr, "a mapping of its own")

	// The owner's stream waits on its word; the peer's put-with-signal on a Stream
	// condition writes it after the data, from the peer's stream.
	sb, err := dev.NewStream()
	require.NoError(t, err)
	defer sb.Close()
	require.NoError(t, sb.WaitValue(words.Word(1), 7, stream.GEQ))
	seen := make(chan uint32, 1)
	require.NoError(t, sb.LaunchHostFunc(func() { seen <- checksum(alloc.Bytes()[:32<<10]) }))
	sa, sc := streamCondition(t, dev)
	src := pattern(32<<10, 3)
	r, err := p.epA.PutSignalNbx(src, rk.Base(), rk, Signal{Op: SignalStore, Value: 7, Addr: wk.Base() + 8, Rkey: wk}, &RequestParam{Condition: sc})
	require.NoError(t, err)
	select {
	case got := <-seen:
		require.Equal(t, checksum(src), got, "the data was in place when the word was")
	case <-ctx.Done():
		t.Fatal("the owner's stream never saw the word")
	}
	require.NoError(t, r.Wait(ctx))
	require.NoError(t, sa.Synchronize())

	// No condition: the worker's stream; the owner's CPU reads the word.
	r, err = p.epA.PutSignalNbx(pattern(64, 4), rk.Base()+64, rk, Signal{Op: SignalSet, Value: 9, Addr: wk.Base(), Rkey: wk}, nil)
	require.NoError(t, err)
	require.NoError(t, r.Wait(ctx))
	require.EqualValues(t, 9, words.Word(0).Load())
	require.Equal(t, pattern(64, 4), alloc.Bytes()[64:128])

	// Every other use of the key is UCX's: an atomic add lands in the same words.
	a, err := p.epA.AtomicNbx(AtomicParam{Op: AtomicAdd, Operand: 5, Size: 8}, wk.Base()+24, wk, nil)
	require.NoError(t, err)
	stop := background(p.b)
	require.NoError(t, a.Wait(ctx))
	f, err := p.epA.FlushNbx(nil)
	require.NoError(t, err)
	require.NoError(t, f.Wait(ctx))
	stop()
	require.EqualValues(t, 5, words.Word(3).Load())

	// Closing the words revokes the key: the peer unmaps before it acknowledges.
	stop = background(p.a)
	require.NoError(t, words.Close())
	stop()
	require.Equal(t, 1, fakeipc.Stats().SharedUnmaps-before.SharedUnmaps)
	_, err = wk.DeviceAddress(wk.Base(), 8)
	require.ErrorIs(t, err, ErrRevoked)
	require.NoError(t, wk.Close())
	require.Equal(t, 1, fakeipc.Stats().SharedUnmaps-before.SharedUnmaps, "unmapped once")
}

// A host backend's Signals (no DeviceIPC) stay unshared; a context without Device
// never shares.
func TestSignalWordsNotShared(t *testing.T) {
	p, _ := ipcPair(t)
	before := fakeipc.Stats()
	words, err := p.b.NewSignals(hostBackend(t), 2)
	require.NoError(t, err)
	defer words.Close()
	packed, err := words.PackRkey()
	require.NoError(t, err)
	wk, err := p.epA.UnpackRkey(packed)
	require.NoError(t, err)
	defer wk.Close()
	require.Equal(t, before.SharedAllocs, fakeipc.Stats().SharedAllocs)
	_, err = wk.DeviceAddress(wk.Base(), 8)
	require.ErrorIs(t, err, ErrUnsupported)
}

func TestSharedWordsPayloadRefused(t *testing.T) {
	good := sharedWordsPayload(stream.SharedWords{FD: 5, Size: 4096}, []byte{1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0})
	sw, inner, err := decodeSharedWordsPayload(good, 64)
	require.NoError(t, err)
	require.Equal(t, 5, sw.FD)
	require.Len(t, inner, 11)
	for name, b := range map[string][]byte{
		"short":          good[:sharedWordsFixed-1],
		"region too big": good,
		"zero size":      sharedWordsPayload(stream.SharedWords{FD: 5, Size: 0}, good[sharedWordsFixed:]),
		"bad UCX key":    sharedWordsPayload(stream.SharedWords{FD: 5, Size: 4096}, []byte{0, 0}),
	} {
		length := uint64(64)
		if name == "region too big" {
			length = 8192
		}
		_, _, err := decodeSharedWordsPayload(b, length)
		require.ErrorIs(t, err, ErrInvalidParam, name)
	}
}

// A failed peer's mappings are dropped once ucpx's copies ended, except those of
// keys whose DeviceAddress was handed out: they stay until the key is closed.
func TestPeerFailureKeepsAddressedMappings(t *testing.T) {
	p, dev := ipcPair(t)
	before := fakeipc.Stats()
	alloc := fakeipc.Malloc(8192)
	defer alloc.Free()
	m1, k1 := deviceRegion(t, p.ctxB, alloc, 0, 4096)
	defer m1.Close()
	plain, err := p.epA.UnpackRkey(k1)
	require.NoError(t, err)
	alloc2 := fakeipc.Malloc(4096)
	defer alloc2.Free()
	m2, k2 := deviceRegion(t, p.ctxB, alloc2, 0, 4096)
	defer m2.Close()
	held, err := p.epA.UnpackRkey(k2)
	require.NoError(t, err)
	_, wpacked := peerSignals(t, p, dev, 2)
	wk, err := p.epA.UnpackRkey(wpacked)
	require.NoError(t, err)
	_, err = held.DeviceAddress(held.Base(), 8)
	require.NoError(t, err)
	_, err = wk.DeviceAddress(wk.Base(), 8)
	require.NoError(t, err)
	require.Equal(t, 2, fakeipc.Stats().Opens-before.Opens)

	p.a.mu.Lock()
	p.epA.failLocked(ErrConnectionReset)
	p.a.mu.Unlock()
	p.a.Progress() // runs the deferred failure hooks
	require.Eventually(t, func() bool { return fakeipc.Stats().Closes-before.Closes == 1 }, 5*time.Second, time.Millisecond,
		"the plain key's mapping is dropped")
	time.Sleep(20 * time.Millisecond)
	st := fakeipc.Stats()
	require.Equal(t, 1, st.Closes-before.Closes, "the addressed device region stays mapped")
	require.Equal(t, 0, st.SharedUnmaps-before.SharedUnmaps, "the addressed words stay mapped")
	_, err = held.DeviceAddress(held.Base(), 8)
	require.ErrorIs(t, err, ErrPeerFailed, "no new address after the failure")

	require.NoError(t, held.Close())
	require.NoError(t, wk.Close())
	require.NoError(t, plain.Close())
	require.Eventually(t, func() bool {
		st := fakeipc.Stats()
		return st.Closes-before.Closes == 2 && st.SharedUnmaps-before.SharedUnmaps == 1
	}, 5*time.Second, time.Millisecond, "closing the keys unmaps")
}

// StageAlways on the IPC path really stages: the copy goes through a pinned buffer
// of the device's pool in two hops on the operation's stream (counted in
// StagingStats, given back on completion), with the same data; without it nothing is
// staged.
func TestIPCStageAlways(t *testing.T) {
	p, dev := ipcPair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	alloc, _, rk := mappedRegion(t, p, 256<<10)
	stage := &RequestParam{Staging: protocol.StageAlways}

	before := p.a.StagingStats()
	src := pattern(64<<10, 21)
	r, err := p.epA.PutNbx(src, rk.Base(), rk, nil)
	require.NoError(t, err)
	require.NoError(t, r.Wait(ctx))
	require.Equal(t, before, p.a.StagingStats(), "the default moves directly")

	// No condition: the worker's stream.
	r, err = p.epA.PutNbx(src, rk.Base(), rk, stage)
	require.NoError(t, err)
	require.NoError(t, r.Wait(ctx))
	require.Equal(t, checksum(src), checksum(alloc.Bytes()[:64<<10]))
	st := p.a.StagingStats()
	require.EqualValues(t, 64<<10, st.Bytes-before.Bytes, "the put was staged")
	require.EqualValues(t, 1, st.Parts-before.Parts)

	// A get, and a callback that still runs.
	back := make([]byte, 64<<10)
	called := 0
	g, err := p.epA.GetNbx(back, rk.Base(), rk, &RequestParam{Staging: protocol.StageAlways, Callback: func(*Request) { called++ }})
	require.NoError(t, err)
	require.NoError(t, g.Wait(ctx))
	require.Equal(t, src, back)
	require.Equal(t, 1, called)

	// A Stream condition: both hops on its stream.
	s, sc := streamCondition(t, dev)
	src2 := pattern(100<<10, 22)
	r, err = p.epA.PutNbx(src2, rk.Base()+4096, rk, &RequestParam{Condition: sc, Staging: protocol.StageAlways})
	require.NoError(t, err)
	require.NoError(t, r.Wait(ctx))
	require.NoError(t, s.Synchronize())
	require.Equal(t, checksum(src2), checksum(alloc.Bytes()[4096:4096+100<<10]))

	// Put with signal into shared words.
	words, packed := peerSignals(t, p, dev, 1)
	wk, err := p.epA.UnpackRkey(packed)
	require.NoError(t, err)
	r, err = p.epA.PutSignalNbx(src, rk.Base()+128<<10, rk, Signal{Op: SignalStore, Value: 5, Addr: wk.Base(), Rkey: wk}, stage)
	require.NoError(t, err)
	require.NoError(t, r.Wait(ctx))
	require.EqualValues(t, 5, words.Word(0).Load())
	require.Equal(t, checksum(src), checksum(alloc.Bytes()[128<<10:192<<10]))

	// A kernel-triggered put: the buffer is reserved at the call, the engine stages
	// it at the trigger.
	kc, trigger := kernelCondition(t)
	src3 := pattern(32<<10, 23)
	r, err = p.epA.PutNbx(src3, rk.Base()+192<<10, rk, &RequestParam{Condition: kc, MemoryType: MemoryCUDA, Staging: protocol.StageAlways})
	require.NoError(t, err)
	trigger()
	require.NoError(t, r.Wait(ctx))
	require.Equal(t, checksum(src3), checksum(alloc.Bytes()[192<<10:224<<10]))

	st = p.a.StagingStats()
	require.EqualValues(t, 5, st.Parts-before.Parts, "every staged operation counted")
	require.NotZero(t, st.HighWater)
	// One after another, each given back on completion: never more than the largest
	// (100 KiB, in its size class) lent at once, where keeping them would be 352 KiB.
	require.LessOrEqual(t, st.HighWater, uint64(128<<10), "staging buffers given back on completion")
}

// A peer's key that names shared words which are not what it says (a plain file, a
// size larger than the segment, an fd that does not exist) unpacks as a UCX key with
// no mapping: nothing is mapped, the words get no device address, and a device
// put-with-signal on it is refused at the call.
func TestSharedWordsForgedKey(t *testing.T) {
	p, dev := ipcPair(t)
	before := fakeipc.Stats()
	_, packed := peerSignals(t, p, dev, 2)
	kb := p.ctxB.trust
	k, err := openRkey(kb.seal, packed)
	require.NoError(t, err)
	require.NotNil(t, k.shared)
	plain, err := os.CreateTemp(t.TempDir(), "plain")
	require.NoError(t, err)
	defer plain.Close()
	require.NoError(t, plain.Truncate(int64(k.shared.Size)))
	_, _, rk := mappedRegion(t, p, 4096)
	for name, sw := range map[string]stream.SharedWords{
		"a plain file":     {FD: int(plain.Fd()), Size: k.shared.Size},
		"a larger segment": {FD: k.shared.FD, Size: 2 * k.shared.Size},
		"no such fd":       {FD: 1 << 20, Size: k.shared.Size},
	} {
		forged := sealRkey(kb.seal, kb.id, k.keyID, k.base, k.length, sharedWordsPayload(sw, k.payload))
		wk, err := p.epA.UnpackRkey(forged)
		require.NoError(t, err, name)
		_, err = wk.DeviceAddress(wk.Base(), 8)
		require.ErrorIs(t, err, ErrUnsupported, name)
		_, err = p.epA.PutSignalNbx(pattern(64, 1), rk.Base(), rk, Signal{Op: SignalStore, Value: 1, Addr: wk.Base(), Rkey: wk}, nil)
		require.ErrorIs(t, err, ErrUnsupported, name)
		require.NoError(t, wk.Close())
	}
	require.Equal(t, before.SharedMaps, fakeipc.Stats().SharedMaps, "nothing was mapped")
}

// peerSignals makes n Signals words of dev at B and packs their key; they are closed
// (with A progressing, to acknowledge the revocation) when the test ends, unless the
// test closed them.
func peerSignals(t *testing.T, p *pair, dev *fakeipc.Device, n int) (*Signals, []byte) {
	t.Helper()
	words, err := p.b.NewSignals(dev, n)
	require.NoError(t, err)
	t.Cleanup(func() {
		stop := background(p.a)
		_ = words.Close() // ErrClosed where the test closed them
		stop()
	})
	packed, err := words.PackRkey()
	require.NoError(t, err)
	return words, packed
}

// A put of host memory into a peer's shared words is CPU stores into the mapping: it
// lands at once and completes in place, with no UCX and no progress of the peer's,
// which here has none (over tcp, UCX's put is an active message the peer would have
// to progress). Undeclared memory still goes through UCX.
func TestPutIntoSharedWordsByStores(t *testing.T) {
	dev := fakeipc.New(hostBackend(t), fakeUUID)
	tcp := map[string]string{"UCX_TLS": "tcp,self"}
	p, l, err := listenPair(t, ContextParams{Device: dev, Config: tcp}, ContextParams{Device: dev, Config: tcp})
	require.NoError(t, err)
	require.NoError(t, l.Close())
	words, err := p.b.NewSignals(dev, 4)
	require.NoError(t, err)
	defer func() {
		stop := background(p.a)
		_ = words.Close()
		stop()
	}()
	packed, err := words.PackRkey()
	require.NoError(t, err)
	wk, err := p.epA.UnpackRkey(packed)
	require.NoError(t, err)

	src := make([]byte, 24) // words 1..3 (the third from bytes at an odd offset)
	binary.NativeEndian.PutUint64(src, 11)
	binary.NativeEndian.PutUint64(src[8:], 12)
	binary.NativeEndian.PutUint64(src[16:], 13)
	r, err := p.epA.PutNbx(src, wk.Base()+8, wk, &RequestParam{MemoryType: MemoryHost})
	require.NoError(t, err)
	require.True(t, r.Done(), "completed in place")
	require.Equal(t, []uint64{0, 11, 12, 13}, []uint64{words.Word(0).Load(), words.Word(1).Load(), words.Word(2).Load(), words.Word(3).Load()},
		"in place before the owner progressed at all")

	// A registered host buffer (MemH) counts as host memory too; past the words, the
	// range check still refuses.
	m, err := p.ctxA.MemAlloc(8)
	require.NoError(t, err)
	defer m.Close()
	binary.NativeEndian.PutUint64(m.Bytes(), 99)
	r, err = p.epA.PutNbx(m.Bytes(), wk.Base(), wk, &RequestParam{MemH: m})
	require.NoError(t, err)
	require.True(t, r.Done())
	require.Equal(t, uint64(99), words.Word(0).Load())
	_, err = p.epA.PutNbx(src, wk.Base()+16, wk, &RequestParam{MemoryType: MemoryHost})
	require.ErrorIs(t, err, ErrOutOfRange)

	// Undeclared memory is UCX's to move: it lands once the owner progresses.
	binary.NativeEndian.PutUint64(src, 21)
	r, err = p.epA.PutNbx(src[:8], wk.Base()+24, wk, nil)
	require.NoError(t, err)
	stop := background(p.b)
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, r.Wait(ctx))
	fr, err := p.epA.FlushNbx(nil)
	require.NoError(t, err)
	require.NoError(t, fr.Wait(ctx))
	require.Equal(t, uint64(21), words.Word(3).Load())
}
