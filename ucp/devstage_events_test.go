package ucp

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/condition"
	"github.com/ucpx/ucpx/graph"
	"github.com/ucpx/ucpx/internal/testenv/fakeipc"
	"github.com/ucpx/ucpx/protocol"
	"github.com/ucpx/ucpx/stream/streamcore"
)

// eventCounting is pinnedCounting that also counts the events made (cuEventCreate on
// CUDA), and those made while its late counter is armed.
type eventCounting struct {
	*pinnedCounting
	events   atomic.Int64
	lateEvts lateCounter
}

func (d *eventCounting) NewEvent() (streamcore.Event, error) {
	d.events.Add(1)
	d.lateEvts.note()
	return d.pinnedCounting.NewEvent()
}

// noEventLate runs f (which triggers operations) and fails if an event was made
// meanwhile: by the engine, at a trigger.
func (d *eventCounting) noEventLate(t *testing.T, f func()) {
	t.Helper()
	d.lateEvts.none(t, "events made", f)
}

// Several device operations the engine issues at one trigger (staged receives with no
// stream to stage on, CUDA-IPC puts staged or not, a graph's receives at every
// launch) each find an event of the worker's pool reserved at their submit: the
// engine makes none. Before, the submit took one event and put it straight back, so
// the pool held one however many operations were prepared, and the engine made the
// rest at the trigger. The reservations end with their operations: the pool keeps
// nothing for them afterwards, and later operations reuse the events.
func TestEngineIssuedDeviceEventsReservedAtSubmit(t *testing.T) {
	setup := func(t *testing.T) (*pair, *eventCounting, context.Context) {
		dev := &eventCounting{pinnedCounting: &pinnedCounting{Device: fakeipc.New(hostBackend(t), fakeUUID)}}
		p, l, err := listenPair(t, ContextParams{Device: dev}, ContextParams{Device: dev})
		require.NoError(t, err)
		require.NoError(t, l.Close())
		t.Cleanup(background(p.b))
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		t.Cleanup(cancel)
		return p, dev, ctx
	}
	kept := func(w *Worker) int {
		w.mu.Lock()
		defer w.mu.Unlock()
		return w.ipcEvKept
	}
	const n, k = 64 << 10, 4 // k operations at one trigger

	t.Run("staged receives", func(t *testing.T) {
		p, dev, ctx := setup(t)
		mem := fakeipc.Malloc(k * n)
		defer mem.Free()
		for round := range 2 {
			kc, trigger := kernelCondition(t)
			var rs []*Request
			for i := range k {
				r, err := p.a.TagRecvNbx(DeviceBuffer(mem.Ptr()+uintptr(i*n), n), uint64(10*round+i), ^uint64(0), &RequestParam{Condition: kc, MemoryType: MemoryCUDA})
				require.NoError(t, err)
				rs = append(rs, r)
			}
			require.Equal(t, k, kept(p.a), "one event kept per prepared operation")
			dev.noEventLate(t, func() {
				trigger()
				for i := range k {
					sb, err := p.epB.TagSendNbx(pattern(n, int64(10*round+i)), uint64(10*round+i), nil)
					require.NoError(t, err)
					require.NoError(t, sb.Wait(ctx))
				}
				for _, r := range rs {
					require.NoError(t, r.Wait(ctx))
				}
			})
			for i := range k {
				require.Equal(t, pattern(n, int64(10*round+i)), mem.Bytes()[i*n:(i+1)*n])
			}
			require.Zero(t, kept(p.a), "the completed operations' reservations ended")
		}
	})

	for _, staging := range []protocol.Staging{protocol.StageAlways, protocol.StageNever} {
		t.Run("ipc puts "+staging.String(), func(t *testing.T) {
			p, dev, ctx := setup(t)
			src := fakeipc.Malloc(k * n)
			defer src.Free()
			dst, _, rk := mappedRegion(t, p, k*n)
			made := int64(0)
			for round := range 2 {
				kc, trigger := kernelCondition(t)
				var rs []*Request
				for i := range k {
					copy(src.Bytes()[i*n:(i+1)*n], pattern(n, int64(10*round+i)))
					r, err := p.epA.PutNbx(DeviceBuffer(src.Ptr()+uintptr(i*n), n), rk.Base()+uint64(i*n), rk, &RequestParam{Condition: kc, MemoryType: MemoryCUDA, Staging: staging})
					require.NoError(t, err)
					rs = append(rs, r)
				}
				require.Equal(t, k, kept(p.a), "one event kept per prepared operation")
				dev.noEventLate(t, func() {
					trigger()
					for _, r := range rs {
						require.NoError(t, r.Wait(ctx))
					}
				})
				for i := range k {
					require.Equal(t, pattern(n, int64(10*round+i)), dst.Bytes()[i*n:(i+1)*n])
				}
				require.Zero(t, kept(p.a), "the completed operations' reservations ended")
				if round == 0 {
					made = dev.events.Load()
				}
			}
			require.Equal(t, made, dev.events.Load(), "the second round reused the first's events")
		})
	}

	t.Run("canceled and refused", func(t *testing.T) {
		p, _, _ := setup(t)
		mem := fakeipc.Malloc(n)
		defer mem.Free()
		kc, trigger := kernelCondition(t)
		r, err := p.a.TagRecvNbx(DeviceBuffer(mem.Ptr(), n), 1, ^uint64(0), &RequestParam{Condition: kc, MemoryType: MemoryCUDA})
		require.NoError(t, err)
		require.Equal(t, 1, kept(p.a))
		r.Cancel()
		trigger()
		require.ErrorIs(t, r.Wait(context.Background()), ErrCanceled)
		require.Zero(t, kept(p.a), "a canceled operation's reservation ended")

		dc, err := condition.Create(condition.Param{Category: condition.KernelTriggered, Backend: hostBackend(t)})
		require.NoError(t, err)
		require.NoError(t, dc.Destroy())
		_, err = p.a.TagRecvNbx(DeviceBuffer(mem.Ptr(), n), 2, ^uint64(0), &RequestParam{Condition: dc, MemoryType: MemoryCUDA})
		require.Error(t, err)
		require.Zero(t, kept(p.a), "a refused operation's reservation ended")
	})

	// Takers without a reservation (copies on the caller's goroutine) leave the kept
	// events alone: they make one instead, and the trigger still makes none.
	t.Run("others leave kept events", func(t *testing.T) {
		p, dev, ctx := setup(t)
		mem := fakeipc.Malloc(n)
		defer mem.Free()
		kc, trigger := kernelCondition(t)
		r, err := p.a.TagRecvNbx(DeviceBuffer(mem.Ptr(), n), 1, ^uint64(0), &RequestParam{Condition: kc, MemoryType: MemoryCUDA})
		require.NoError(t, err)
		before := dev.events.Load()
		p.a.mu.Lock()
		ev, err := p.a.takeIPCEventLocked(nil)
		require.NoError(t, err)
		require.GreaterOrEqual(t, len(p.a.ipcEvents), p.a.ipcEvKept)
		p.a.mu.Unlock()
		require.Equal(t, before+1, dev.events.Load(), "the kept event was taken by an operation without a reservation")
		dev.noEventLate(t, func() {
			trigger()
			sb, err := p.epB.TagSendNbx(pattern(n, 1), 1, nil)
			require.NoError(t, err)
			require.NoError(t, sb.Wait(ctx))
			require.NoError(t, r.Wait(ctx))
		})
		p.a.mu.Lock()
		p.a.putIPCEvent(nil, ev)
		p.a.mu.Unlock()
		require.Zero(t, kept(p.a))
	})

	t.Run("graph", func(t *testing.T) {
		p, dev, ctx := setup(t)
		mem := fakeipc.Malloc(k * n)
		defer mem.Free()
		b := hostBackend(t)
		s, err := b.NewStream()
		require.NoError(t, err)
		defer s.Close()
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
		dev.noEventLate(t, func() {
			for launch := range 3 {
				require.NoError(t, x.Launch(s))
				for i := range k {
					sb, err := p.epB.TagSendNbx(pattern(n, int64(10*launch+i)), 0x700+uint64(i), nil)
					require.NoError(t, err)
					require.NoError(t, sb.Wait(ctx))
				}
				require.NoError(t, s.Synchronize())
				for i := range k {
					require.Equal(t, pattern(n, int64(10*launch+i)), mem.Bytes()[i*n:(i+1)*n], "launch %d", launch)
				}
				require.Equal(t, k, kept(p.a), "launch %d: the graph's operations keep their events", launch)
			}
		})
		require.NoError(t, x.Close())
		for _, c := range cs {
			require.NoError(t, c.Destroy())
		}
		for _, r := range rs {
			_ = r.Wait(ctx) // completed for good: its reservations end
		}
		require.Zero(t, kept(p.a), "the destroyed graph operations' reservations ended")
	})
}
