package ucp

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/condition"
	"github.com/ucpx/ucpx/internal/testenv/fakeipc"
	"github.com/ucpx/ucpx/stream"
)

// connectWorkers connects a to b through a listener of b: a's endpoint to b and b's to a.
func connectWorkers(t *testing.T, a, b *Worker) (ab, ba *Endpoint) {
	t.Helper()
	l, err := b.Listen("127.0.0.1:0", nil)
	require.NoError(t, err)
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	accepted := make(chan error, 1)
	go func() {
		var err error
		ba, err = l.Accept(ctx, nil)
		accepted <- err
	}()
	stop := background(b)
	ab, err = a.Connect(ctx, l.Addr(), nil)
	require.NoError(t, err)
	require.NoError(t, <-accepted)
	stop()
	return ab, ba
}

// nvFuser's case on the fake device: a pipelined ring allgather of three ranks over
// the IPC path, each rank reallocating its receive buffer every iteration (the
// allocator hands the same address back or another), keys sent with the data's
// first need and no barrier: each rank forwards a chunk as soon as its stream sees
// it arrived, and a consumer on the stream checks every chunk of every iteration.
func TestIPCRingAllgatherRealloc(t *testing.T) {
	const ranks, iters, chunk = 3, 24, 8 << 10
	const flagsLen = 64
	dev := fakeipc.New(hostBackend(t), fakeUUID)
	type rank struct {
		ctx         *Context
		w           *Worker
		right, left *Endpoint // right: where it puts; left: who puts into it
	}
	rs := make([]*rank, ranks)
	for i := range rs {
		c, err := NewContext(ContextParams{Device: dev})
		require.NoError(t, err)
		w, err := c.NewWorker(WorkerParams{})
		require.NoError(t, err)
		rs[i] = &rank{ctx: c, w: w}
		t.Cleanup(func() { _ = w.Close(); _ = c.Close() })
	}
	for i := range rs {
		rs[i].right, rs[(i+1)%ranks].left = connectWorkers(t, rs[i].w, rs[(i+1)%ranks].w)
	}
	stops := make([]func(), ranks)
	for i := range rs {
		stops[i] = background(rs[i].w)
	}
	defer func() {
		for _, s := range stops {
			s()
		}
	}()
	const keyTag = 1 << 40
	want := func(r, k int) []byte { return pattern(chunk, int64(1000*k+r)) }

	var wg sync.WaitGroup
	errs := make(chan error, ranks)
	addrs := make([]map[uintptr]bool, ranks)
	for ri := range rs {
		wg.Add(1)
		addrs[ri] = map[uintptr]bool{}
		go func() {
			defer wg.Done()
			errs <- func() error {
				me := rs[ri]
				s, err := dev.NewStream()
				if err != nil {
					return err
				}
				defer s.Close()
				sc, err := condition.Create(condition.Param{Category: condition.Stream, Backend: dev, Stream: s})
				if err != nil {
					return err
				}
				defer sc.Destroy()
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				var alloc *fakeipc.Alloc
				var region *MemH
				var rightKey *Rkey
				for k := 1; k <= iters; k++ {
					// A new receive buffer every iteration: the old one's key is
					// revoked (the left rank unmaps it), then it is freed.
					if region != nil {
						if err := region.Close(); err != nil {
							return fmt.Errorf("iteration %d: close: %w", k, err)
						}
						alloc.Free()
					}
					alloc = fakeipc.Malloc(flagsLen + ranks*chunk)
					addrs[ri][alloc.Ptr()] = true
					if region, err = me.ctx.MemMapPtr(alloc.Ptr(), flagsLen+ranks*chunk, MemoryCUDA); err != nil {
						return err
					}
					packed, err := region.PackRkey()
					if err != nil {
						return err
					}
					// The key goes to the left rank, which puts into this buffer; the
					// right rank's key comes the same way. No barrier: that message is
					// the only thing waited for.
					kb := make([]byte, 4096)
					kr, err := me.w.TagRecvNbx(kb, keyTag|uint64(k), ^uint64(0), &RequestParam{Peer: me.right})
					if err != nil {
						return err
					}
					sr, err := me.left.TagSendNbx(packed, keyTag|uint64(k), nil)
					if err != nil {
						return err
					}
					if err := kr.Wait(ctx); err != nil {
						return err
					}
					if err := sr.Wait(ctx); err != nil {
						return err
					}
					if rightKey != nil {
						if err := rightKey.Close(); err != nil {
							return err
						}
					}
					if rightKey, err = me.right.UnpackRkey(kb[:kr.Length()]); err != nil {
						return err
					}
					slot := func(j int) uintptr { return alloc.Ptr() + flagsLen + uintptr(j*chunk) }
					// The rank's own chunk into its slot, then the ring: step s sends
					// slot (r-s) mod n to the right once it is here.
					own := want(ri, k)
					copy(alloc.Bytes()[flagsLen+ri*chunk:], own)
					for st := 0; st < ranks-1; st++ {
						j := (ri - st + ranks) % ranks
						if st > 0 {
							if err := dev.WaitValueAt(s, alloc.Ptr()+uintptr(8*j), uint64(k), stream.GEQ); err != nil {
								return err
							}
						}
						src := DeviceBuffer(slot(j), chunk)
						_, err := me.right.PutSignalNbx(src, rightKey.Base()+flagsLen+uint64(j*chunk), rightKey,
							Signal{Op: SignalSet, Value: uint64(k), Addr: rightKey.Base() + uint64(8*j), Rkey: rightKey},
							&RequestParam{Condition: sc})
						if err != nil {
							return fmt.Errorf("iteration %d step %d: %w", k, st, err)
						}
					}
					// The consumer: every chunk of this iteration, in stream order.
					for j := range ranks {
						if j != ri {
							if err := dev.WaitValueAt(s, alloc.Ptr()+uintptr(8*j), uint64(k), stream.GEQ); err != nil {
								return err
							}
						}
					}
					bad := make(chan string, 1)
					buf := alloc.Bytes()
					if err := s.LaunchHostFunc(func() {
						for j := range ranks {
							if checksum(buf[flagsLen+j*chunk:flagsLen+(j+1)*chunk]) != checksum(want(j, k)) {
								bad <- fmt.Sprintf("rank %d iteration %d: chunk %d wrong", ri, k, j)
								return
							}
						}
						bad <- ""
					}); err != nil {
						return err
					}
					// The right rank revokes this buffer's key next iteration and waits
					// for the acknowledgement, which comes after our puts are flushed.
					if err := s.Synchronize(); err != nil {
						return err
					}
					if msg := <-bad; msg != "" {
						return fmt.Errorf("%s", msg)
					}
					if f := binary.NativeEndian.Uint64(buf[8*((ri+1)%ranks):]); f != uint64(k) {
						return fmt.Errorf("rank %d iteration %d: flag %d", ri, k, f)
					}
				}
				if rightKey != nil {
					_ = rightKey.Close()
				}
				err = region.Close()
				alloc.Free()
				return err
			}()
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	t.Logf("distinct buffer addresses per rank over %d iterations: %d, %d, %d", iters, len(addrs[0]), len(addrs[1]), len(addrs[2]))
}
