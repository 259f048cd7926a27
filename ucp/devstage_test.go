package ucp

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/internal/testenv/fakeipc"
	"github.com/ucpx/ucpx/stream/streamcore"
)

// Device buffers with no stream: staged through the context's device (here the fake
// one), with no condition, under a kernel-triggered condition and as a non-blocking
// receive; every byte checked.
func TestDeviceStagingWithoutStream(t *testing.T) {
	p, dev := ipcPair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const n = 100 << 10
	mem := fakeipc.Malloc(4 * n)
	defer mem.Free()
	dbuf := func(i int) []byte { return DeviceBuffer(mem.Ptr()+uintptr(i*n), n) }
	cuda := &RequestParam{MemoryType: MemoryCUDA}
	before := p.a.StagingStats()

	// Tag send from device memory, tag receive into device memory.
	copy(mem.Bytes()[:n], pattern(n, 1))
	in := make([]byte, n)
	rb, err := p.b.TagRecvNbx(in, 5, ^uint64(0), nil)
	require.NoError(t, err)
	r, err := p.epA.TagSendNbx(dbuf(0), 5, cuda)
	require.NoError(t, err)
	require.NoError(t, r.Wait(ctx))
	require.NoError(t, rb.Wait(ctx))
	require.Equal(t, pattern(n, 1), in)
	sb, err := p.epB.TagSendNbx(pattern(n/2, 2), 6, nil)
	require.NoError(t, err)
	r, err = p.a.TagRecvNbx(dbuf(1), 6, ^uint64(0), cuda)
	require.NoError(t, err)
	require.NoError(t, r.Wait(ctx))
	require.NoError(t, sb.Wait(ctx))
	require.Equal(t, n/2, r.Length())
	require.EqualValues(t, 6, r.SenderTag())
	require.Equal(t, pattern(n/2, 2), mem.Bytes()[n:n+n/2])

	// Put from device memory into a host region, get back into device memory.
	region, err := p.ctxB.MemAlloc(n)
	require.NoError(t, err)
	packed, err := region.PackRkey()
	require.NoError(t, err)
	rk, err := p.epA.UnpackRkey(packed)
	require.NoError(t, err)
	copy(mem.Bytes()[2*n:3*n], pattern(n, 3))
	r, err = p.epA.PutNbx(dbuf(2), rk.Base(), rk, cuda)
	require.NoError(t, err)
	require.NoError(t, r.Wait(ctx))
	f, err := p.epA.FlushNbx(nil)
	require.NoError(t, err)
	require.NoError(t, f.Wait(ctx))
	require.Equal(t, pattern(n, 3), region.Bytes())
	r, err = p.epA.GetNbx(dbuf(3), rk.Base(), rk, cuda)
	require.NoError(t, err)
	require.NoError(t, r.Wait(ctx))
	require.Equal(t, pattern(n, 3), mem.Bytes()[3*n:4*n])

	// A kernel-triggered receive into device memory: nothing before the trigger.
	kc, trigger := kernelCondition(t)
	r, err = p.a.TagRecvNbx(dbuf(0), 7, ^uint64(0), &RequestParam{Condition: kc, MemoryType: MemoryCUDA})
	require.NoError(t, err)
	sb, err = p.epB.TagSendNbx(pattern(n, 4), 7, nil)
	require.NoError(t, err)
	time.Sleep(10 * time.Millisecond)
	require.False(t, r.Done(), "ran before its trigger")
	trigger()
	require.NoError(t, r.Wait(ctx))
	require.NoError(t, sb.Wait(ctx))
	require.Equal(t, pattern(n, 4), mem.Bytes()[:n])

	// A non-blocking receive into device memory on a Stream condition; a later wait
	// on the stream orders work after its copy in.
	s, sc := streamCondition(t, dev)
	r, err = p.a.TagRecvNbx(dbuf(1), 8, ^uint64(0), &RequestParam{Condition: sc, MemoryType: MemoryCUDA, Flags: NonBlockingEnqueue})
	require.NoError(t, err)
	sb, err = p.epB.TagSendNbx(pattern(n, 5), 8, nil)
	require.NoError(t, err)
	require.NoError(t, r.WaitOnStream(s))
	seen := make(chan uint32, 1)
	require.NoError(t, s.LaunchHostFunc(func() { seen <- checksum(mem.Bytes()[n : 2*n]) }))
	require.Equal(t, checksum(pattern(n, 5)), <-seen)
	require.NoError(t, r.Wait(ctx))
	require.NoError(t, sb.Wait(ctx))

	after := p.a.StagingStats()
	require.GreaterOrEqual(t, after.Bytes-before.Bytes, uint64(4*n), "the device buffers were staged")
	stop := background(p.a)
	require.NoError(t, region.Close())
	stop()
}

// Without ContextParams.Device a device buffer with no stream is refused at the call.
func TestDeviceWithoutStreamRefused(t *testing.T) {
	p := newShmPair(t)
	_, err := p.epA.TagSendNbx(make([]byte, 8), 1, &RequestParam{MemoryType: MemoryCUDA})
	require.ErrorIs(t, err, ErrUnsupported)
}

// A device operation staged with no condition is waited for on the host, as other
// operations without a condition are: WaitOnStream refuses it while it is pending
// (its first step's event is not its completion).
func TestDeviceStagedWaitOnStreamRefused(t *testing.T) {
	p, dev := ipcPair(t)
	mem := fakeipc.Malloc(4096)
	defer mem.Free()
	side, err := p.a.ipcSideStream()
	require.NoError(t, err)
	gate := make(chan struct{})
	var open sync.Once
	defer open.Do(func() { close(gate) }) // a failed assertion must not leave the stream held
	require.NoError(t, side.LaunchHostFunc(func() { <-gate }))
	in := make([]byte, 4096)
	rb, err := p.b.TagRecvNbx(in, 3, ^uint64(0), nil)
	require.NoError(t, err)
	copy(mem.Bytes(), pattern(4096, 8))
	r, err := p.epA.TagSendNbx(DeviceBuffer(mem.Ptr(), 4096), 3, &RequestParam{MemoryType: MemoryCUDA})
	require.NoError(t, err)
	s, err := dev.NewStream()
	require.NoError(t, err)
	defer s.Close()
	require.ErrorIs(t, r.WaitOnStream(s), ErrInvalidParam)
	open.Do(func() { close(gate) })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, r.Wait(ctx))
	require.NoError(t, rb.Wait(ctx))
	require.Equal(t, pattern(4096, 8), in)
	require.NoError(t, r.WaitOnStream(s), "a done request needs no wait")
}

// Canceling a staged receive of device memory cancels the receive into staging
// memory it waits for: it completes with ErrCanceled instead of waiting forever.
func TestDeviceStagedReceiveCancel(t *testing.T) {
	p, _ := ipcPair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	mem := fakeipc.Malloc(4096)
	defer mem.Free()
	r, err := p.a.TagRecvNbx(DeviceBuffer(mem.Ptr(), 4096), 77, MaxTag, &RequestParam{MemoryType: MemoryCUDA})
	require.NoError(t, err)
	require.NotNil(t, r.ipc, "staged")
	r.Cancel()
	require.ErrorIs(t, r.Wait(ctx), ErrCanceled)
}

// A zero-length operation declared on device memory (staged: UCX here cannot move
// device memory) is the caller's as it is: its Callback runs and a caller-owned
// Request tracks it. Before, both were dropped with the staging.
func TestDeviceStagedZeroLengthKeepsCallbackAndRequest(t *testing.T) {
	p, _ := ipcPair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rb, err := p.b.TagRecvNbx(make([]byte, 8), 9, MaxTag, nil)
	require.NoError(t, err)
	called := make(chan error, 1)
	var own Request
	r, err := p.epA.TagSendNbx(nil, 9, &RequestParam{MemoryType: MemoryCUDA, Flags: NoImmediateCompletion,
		Request: &own, Callback: func(r *Request) { called <- r.Err() }})
	require.NoError(t, err)
	require.Same(t, &own, r, "the caller's Request")
	require.NoError(t, r.Wait(ctx))
	require.NoError(t, rb.Wait(ctx))
	require.Zero(t, rb.Length())
	select {
	case err := <-called:
		require.NoError(t, err)
	case <-ctx.Done():
		require.FailNow(t, "the Callback of a zero-length staged send never ran")
	}
}

// eventFailing is the fake device whose event creation fails while fail is set.
type eventFailing struct {
	*fakeipc.Device
	fail atomic.Bool
}

var errNoEvent = errors.New("test: no event")

func (d *eventFailing) NewEvent() (streamcore.Event, error) {
	if d.fail.Load() {
		return nil, errNoEvent
	}
	return d.Device.NewEvent()
}

// A staged device receive that fails for want of an event leaves the caller's
// Request as it was: reusable at once, not pending.
func TestDeviceStagedFailureLeavesCallersRequest(t *testing.T) {
	dev := &eventFailing{Device: fakeipc.New(hostBackend(t), fakeUUID)}
	p, l, err := listenPair(t, ContextParams{Device: dev}, ContextParams{Device: dev})
	require.NoError(t, err)
	require.NoError(t, l.Close())
	t.Cleanup(background(p.b))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	const n = 4096
	mem := fakeipc.Malloc(n)
	defer mem.Free()
	var own Request
	dev.fail.Store(true)
	_, err = p.a.TagRecvNbx(DeviceBuffer(mem.Ptr(), n), 9, MaxTag, &RequestParam{MemoryType: MemoryCUDA, Request: &own})
	require.ErrorIs(t, err, errNoEvent)
	dev.fail.Store(false)

	r, err := p.a.TagRecvNbx(DeviceBuffer(mem.Ptr(), n), 9, MaxTag, &RequestParam{MemoryType: MemoryCUDA, Request: &own})
	require.NoError(t, err, "the failed call left the caller's Request pending")
	require.Same(t, &own, r)
	sb, err := p.epB.TagSendNbx(pattern(n, 4), 9, nil)
	require.NoError(t, err)
	require.NoError(t, r.Wait(ctx))
	require.NoError(t, sb.Wait(ctx))
	require.Equal(t, pattern(n, 4), mem.Bytes())
}
