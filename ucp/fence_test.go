package ucp

import (
	"context"
	"encoding/binary"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// hostWord registers an 8-byte word of B's memory, set to v, and unpacks its key at A.
func hostWord(t *testing.T, p *pair, v uint64) (*atomic.Uint64, *Rkey) {
	t.Helper()
	buf := make([]byte, 64)
	word := (*atomic.Uint64)(unsafe.Pointer(&buf[0]))
	word.Store(v)
	m, err := p.ctxB.MemMap(buf)
	require.NoError(t, err)
	packed, err := m.PackRkey()
	require.NoError(t, err)
	rk, err := p.epA.UnpackRkey(packed)
	require.NoError(t, err)
	t.Cleanup(func() {
		stop := background(p.a)
		_ = m.Close()
		stop()
	})
	return word, rk
}

// A copy into the peer's device region issued before a Fence is held back on its
// stream; a UCX put of a flag issued after the fence must not land before the copy.
// Without the gate, shm carries the flag at once while the data waits.
func TestFenceOrdersCopiesBeforeUCX(t *testing.T) {
	p, dev := ipcPair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	alloc, _, rk := mappedRegion(t, p, 256<<10)
	flag, fk := hostWord(t, p, 0)
	counter, ck := hostWord(t, p, 5)
	s, sc := streamCondition(t, dev)
	hold := make(chan struct{})
	var once sync.Once
	release := func() { once.Do(func() { close(hold) }) }
	t.Cleanup(release) // before the stream's cleanup synchronizes it, if an assertion failed
	require.NoError(t, s.LaunchHostFunc(func() { <-hold }))

	src := pattern(256<<10, 7)
	data, err := p.epA.PutNbx(src, rk.Base(), rk, &RequestParam{Condition: sc})
	require.NoError(t, err)
	require.NoError(t, p.a.Fence())
	one := make([]byte, 8)
	binary.NativeEndian.PutUint64(one, 1)
	put, err := p.epA.PutNbx(one, fk.Base(), fk, nil)
	require.NoError(t, err)
	add, err := p.epA.AtomicNbx(AtomicParam{Op: AtomicAdd, Operand: 3, Fetch: true}, ck.Base(), ck, nil)
	require.NoError(t, err)

	stop := background(p.a)
	time.Sleep(50 * time.Millisecond)
	require.Zero(t, flag.Load(), "the flag landed before the copy issued before the fence")
	require.Equal(t, uint64(5), counter.Load(), "the atomic ran before the copy issued before the fence")
	require.False(t, put.Done())
	require.Zero(t, alloc.Bytes()[0])
	release()
	stop()
	waitAll(t, 10*time.Second, data, put, add)
	require.Equal(t, checksum(src), checksum(alloc.Bytes()), "the copy")
	require.Equal(t, uint64(1), flag.Load())
	require.Equal(t, uint64(8), counter.Load())
	require.Equal(t, uint64(5), add.Fetched(), "a held atomic reports what it fetched")

	// Nothing before the fence is pending now: a put after another fence is issued at
	// the call, and the gate is gone once nothing is left to wait for.
	require.NoError(t, p.a.Fence())
	binary.NativeEndian.PutUint64(one, 2)
	require.False(t, p.a.fenceHeld.Load(), "nothing pending at the fence: UCX's operations take no detour")
	put, err = p.epA.PutNbx(one, fk.Base(), fk, nil)
	require.NoError(t, err)
	require.Nil(t, put.ipc, "issued at the call, not held")
	require.NoError(t, put.Wait(ctx))
	require.Eventually(t, func() bool { return flag.Load() == 2 }, 5*time.Second, time.Millisecond)
}

// A copy issued after a Fence waits for UCX's operations before it (a worker flush)
// and for copies before it; afterwards the data of both is in place.
func TestFenceOrdersUCXBeforeCopies(t *testing.T) {
	p, _ := ipcPair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	alloc, _, rk := mappedRegion(t, p, 64<<10)
	flag, fk := hostWord(t, p, 0)
	one := make([]byte, 8)
	binary.NativeEndian.PutUint64(one, 9)
	first, err := p.epA.PutNbx(one, fk.Base(), fk, nil)
	require.NoError(t, err)
	require.NoError(t, p.a.Fence())
	src := pattern(64<<10, 8)
	r, err := p.epA.PutNbx(src, rk.Base(), rk, nil)
	require.NoError(t, err)
	stop := background(p.a)
	defer stop()
	require.NoError(t, r.Wait(ctx))
	require.NoError(t, first.Wait(ctx))
	require.Equal(t, uint64(9), flag.Load(), "the UCX put before the fence had landed when the copy after it completed")
	require.Equal(t, checksum(src), checksum(alloc.Bytes()))
	require.Eventually(t, func() bool {
		p.a.mu.Lock()
		defer p.a.mu.Unlock()
		p.a.fenceHoldLocked(true)
		return !p.a.fenceHeld.Load() && !p.a.fenceFlushes.Load()
	}, 5*time.Second, time.Millisecond, "the gate goes once the flush is done")
}

// Without a device (nothing moves outside UCX) Fence holds nothing back.
func TestFenceHostOnly(t *testing.T) {
	p := newShmPair(t)
	defer p.close(t)
	_, rk := hostWord(t, p, 0)
	require.NoError(t, p.a.Fence())
	require.False(t, p.a.fenceHeld.Load() || p.a.fenceFlushes.Load())
	r, err := p.epA.PutNbx(make([]byte, 8), rk.Base(), rk, nil)
	require.NoError(t, err)
	require.Nil(t, r.ipc)
	p.wait(t, r)
}
