package ucp

import (
	"context"
	"runtime"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/ucpx/ucpx/condition"
	"github.com/ucpx/ucpx/graph"
	"github.com/ucpx/ucpx/internal/testenv/fakeipc"
	"github.com/ucpx/ucpx/protocol"
	"github.com/ucpx/ucpx/stream/streamcore"
)

// pinnedCounting is the fake device with HostStaging (as the CUDA backend has): it
// counts pinned allocations, and those made while its late counter is armed.
type pinnedCounting struct {
	*fakeipc.Device
	allocs atomic.Int64
	late   lateCounter
}

// lateCounter counts the calls made while armed (by the engine, at a trigger) and
// keeps the stack of one.
type lateCounter struct {
	armed atomic.Bool
	n     atomic.Int64
	stack atomic.Pointer[string]
}

// note records a call.
func (l *lateCounter) note() {
	if l.armed.Load() {
		l.n.Add(1)
		buf := make([]byte, 8192)
		s := string(buf[:runtime.Stack(buf, false)])
		l.stack.Store(&s)
	}
}

// none runs f (which triggers operations) armed and fails if a call (what) was made
// meanwhile.
func (l *lateCounter) none(t *testing.T, what string, f func()) {
	t.Helper()
	l.armed.Store(true)
	f()
	l.armed.Store(false)
	if s := l.stack.Load(); s != nil {
		t.Logf("%s after the trigger:\n%s", what, *s)
	}
	require.Zero(t, l.n.Load(), "%s after the trigger (by the engine)", what)
}

type mmapPinned struct{ b []byte }

func (m *mmapPinned) Bytes() []byte { return m.b }
func (m *mmapPinned) Addr() uintptr { return uintptr(unsafe.Pointer(&m.b[0])) }
func (m *mmapPinned) Size() int     { return len(m.b) }
func (m *mmapPinned) Close() error  { return unix.Munmap(m.b) }

func (d *pinnedCounting) Locate(addr uintptr) (bool, bool, error) {
	_, err := d.IPCAllocation(addr)
	return err == nil, false, nil
}

func (d *pinnedCounting) AllocPinned(n int) (streamcore.Pinned, error) {
	d.allocs.Add(1)
	d.late.note()
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, err
	}
	return &mmapPinned{b}, nil
}

// noneLate runs f (which triggers operations) and fails if pinned memory was allocated
// meanwhile: by the engine, at a trigger.
func (d *pinnedCounting) noneLate(t *testing.T, f func()) {
	t.Helper()
	d.late.none(t, "pinned memory allocated", f)
}

// Device operations the engine issues with no stream to stage on (here kernel-triggered
// and graph receives on a context whose UCX cannot move device memory, and
// kernel-triggered CUDA-IPC puts under StageAlways) take staging memory reserved at
// their submit: the engine allocates none at the trigger, for
// several operations of one size class and for a graph's operations at every launch.
// Reservations end with their operations (completed, canceled, failed at submit, their
// graph condition destroyed): later operations find the buffers, the pool does not grow.
func TestEngineIssuedDeviceStagingReservedAtSubmit(t *testing.T) {
	setup := func(t *testing.T) (*pair, *pinnedCounting, context.Context) {
		dev := &pinnedCounting{Device: fakeipc.New(hostBackend(t), fakeUUID)}
		p, l, err := listenPair(t, ContextParams{Device: dev}, ContextParams{Device: dev})
		require.NoError(t, err)
		require.NoError(t, l.Close())
		t.Cleanup(background(p.b))
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		t.Cleanup(cancel)
		return p, dev, ctx
	}
	const n, k = 100 << 10, 3 // k receives of one size class at once
	recvs := func(t *testing.T, p *pair, mem *fakeipc.Alloc, c *condition.Condition, tag uint64) []*Request {
		var rs []*Request
		for i := range k {
			r, err := p.a.TagRecvNbx(DeviceBuffer(mem.Ptr()+uintptr(i*n), n), tag+uint64(i), ^uint64(0), &RequestParam{Condition: c, MemoryType: MemoryCUDA})
			require.NoError(t, err)
			rs = append(rs, r)
		}
		return rs
	}
	sends := func(t *testing.T, ctx context.Context, p *pair, tag uint64, seed int64) {
		for i := range k {
			sb, err := p.epB.TagSendNbx(pattern(n, seed+int64(i)), tag+uint64(i), nil)
			require.NoError(t, err)
			require.NoError(t, sb.Wait(ctx))
		}
	}
	// round submits k kernel-triggered receives, then triggers them and checks the data.
	round := func(t *testing.T, ctx context.Context, p *pair, dev *pinnedCounting, mem *fakeipc.Alloc, tag uint64) {
		kc, trigger := kernelCondition(t)
		rs := recvs(t, p, mem, kc, tag)
		dev.noneLate(t, func() {
			trigger()
			sends(t, ctx, p, tag, int64(tag))
			for _, r := range rs {
				require.NoError(t, r.Wait(ctx))
			}
		})
		for i := range k {
			require.Equal(t, pattern(n, int64(tag)+int64(i)), mem.Bytes()[i*n:(i+1)*n])
		}
	}

	t.Run("kernel", func(t *testing.T) {
		p, dev, ctx := setup(t)
		mem := fakeipc.Malloc(k * n)
		defer mem.Free()
		round(t, ctx, p, dev, mem, 100)
		steady := dev.allocs.Load()
		for i := range 3 {
			round(t, ctx, p, dev, mem, uint64(200+10*i))
		}
		require.Equal(t, steady, dev.allocs.Load(), "the reservations of completed operations were not given back")
	})

	t.Run("canceled and failed", func(t *testing.T) {
		p, dev, ctx := setup(t)
		mem := fakeipc.Malloc(k * n)
		defer mem.Free()
		round(t, ctx, p, dev, mem, 100)
		steady := dev.allocs.Load()

		// Canceled before the trigger (never issued).
		kc, trigger := kernelCondition(t)
		rs := recvs(t, p, mem, kc, 300)
		for _, r := range rs {
			r.Cancel()
		}
		trigger()
		for _, r := range rs {
			require.ErrorIs(t, r.Wait(ctx), ErrCanceled)
		}
		// Canceled once issued (the staged receive waits for a message never sent).
		kc, trigger = kernelCondition(t)
		rs = recvs(t, p, mem, kc, 400)
		dev.noneLate(t, func() {
			trigger()
			pool := p.a.devicePool()
			require.Eventually(t, func() bool { return pool.Lent() == k }, 10*time.Second, time.Millisecond, "issued: staging lent")
		})
		for _, r := range rs {
			r.Cancel()
			require.ErrorIs(t, r.Wait(ctx), ErrCanceled)
		}
		// Refused by the engine after the plan reserved (a destroyed condition).
		dc, err := condition.Create(condition.Param{Category: condition.KernelTriggered, Backend: hostBackend(t)})
		require.NoError(t, err)
		require.NoError(t, dc.Destroy())
		for range 2 * k {
			_, err := p.a.TagRecvNbx(DeviceBuffer(mem.Ptr(), n), 500, ^uint64(0), &RequestParam{Condition: dc, MemoryType: MemoryCUDA})
			require.Error(t, err)
		}

		round(t, ctx, p, dev, mem, 600)
		require.Equal(t, steady, dev.allocs.Load(), "the reservations of canceled or refused operations were not given back")
	})

	t.Run("graph", func(t *testing.T) {
		p, dev, ctx := setup(t)
		mem := fakeipc.Malloc(k * n)
		defer mem.Free()
		b := hostBackend(t)
		s, err := b.NewStream()
		require.NoError(t, err)
		defer s.Close()
		build := func() (*graph.HostExec, []*condition.Condition, []*Request) {
			g := graph.NewHost()
			var cs []*condition.Condition
			var rs []*Request
			for i := range k {
				c, err := condition.Create(condition.Param{Category: condition.Graph, Backend: b, Graph: g})
				require.NoError(t, err)
				r, err := p.a.TagRecvNbx(DeviceBuffer(mem.Ptr()+uintptr(i*n), n), 0x700+uint64(i), ^uint64(0), &RequestParam{Condition: c, MemoryType: MemoryCUDA})
				require.NoError(t, err)
				cs, rs = append(cs, c), append(rs, r)
			}
			x, err := g.Instantiate()
			require.NoError(t, err)
			return x, cs, rs
		}
		destroy := func(x *graph.HostExec, cs []*condition.Condition, rs []*Request) {
			require.NoError(t, x.Close())
			for _, c := range cs {
				require.NoError(t, c.Destroy())
			}
			for _, r := range rs {
				_ = r.Wait(ctx) // completed for good: its reservation ends
			}
		}

		x, cs, rs := build()
		dev.noneLate(t, func() {
			for launch := range 3 {
				require.NoError(t, x.Launch(s))
				sends(t, ctx, p, 0x700, int64(10*launch))
				require.NoError(t, s.Synchronize())
				for i := range k {
					require.Equal(t, pattern(n, int64(10*launch+i)), mem.Bytes()[i*n:(i+1)*n], "launch %d", launch)
				}
			}
		})
		destroy(x, cs, rs)
		steady := dev.allocs.Load()
		// The destroyed conditions' reservations are free for new operations.
		destroy(build())
		require.Equal(t, steady, dev.allocs.Load(), "the reservations of destroyed graph operations were not given back")
	})
	t.Run("ipc staged", func(t *testing.T) {
		p, dev, ctx := setup(t)
		src := fakeipc.Malloc(k * n)
		defer src.Free()
		dst, _, rk := mappedRegion(t, p, k*n)
		for round := range 2 {
			kc, trigger := kernelCondition(t)
			var rs []*Request
			for i := range k {
				copy(src.Bytes()[i*n:(i+1)*n], pattern(n, int64(10*round+i)))
				r, err := p.epA.PutNbx(DeviceBuffer(src.Ptr()+uintptr(i*n), n), rk.Base()+uint64(i*n), rk, &RequestParam{Condition: kc, MemoryType: MemoryCUDA, Staging: protocol.StageAlways})
				require.NoError(t, err)
				rs = append(rs, r)
			}
			dev.noneLate(t, func() {
				trigger()
				for _, r := range rs {
					require.NoError(t, r.Wait(ctx))
				}
			})
			for i := range k {
				require.Equal(t, pattern(n, int64(10*round+i)), dst.Bytes()[i*n:(i+1)*n])
			}
		}
		require.Zero(t, p.a.devicePool().Lent())
	})
}
