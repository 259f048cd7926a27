package tests

import (
	"bytes"
	"context"
	"fmt"
	"time"

	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/cgo/cuda"
	"github.com/ucpx/ucpx/condition"
	"github.com/ucpx/ucpx/stream"
	"github.com/ucpx/ucpx/ucp"
)

// A 2-rank allgather over the IPC path: each rank's output buffer (its exported
// allocation from ipcDataOff) holds rank 0's half then rank 1's; each rank puts its
// half into the peer's buffer with PutSignalNbx on a Stream condition (the iteration
// number as the signal) and its stream waits for the peer's signal. Sizes are output
// bytes, as torch.distributed.all_gather_into_tensor's output tensor and nccl-tests
// count them.

const tagIPCBarrier = 12 << 44 // both ways: a rank finished a size's set-up

// allgatherSizes are the output sizes up to max: 1 MiB to 256 MiB, ×4.
func allgatherSizes(max int) []int {
	var out []int
	for n := 1 << 20; n <= max && n <= 256<<20; n *= 4 {
		out = append(out, n)
	}
	return out
}

// allgatherReps is how many timed allgathers of n output bytes to run.
func allgatherReps(n int) int { return min(1000, max(10, (4<<30)/n)) }

// allgather runs every size of allgatherSizes(max) as rank (0 or 1) and returns the
// time of one allgather per size and the number of sizes whose received half was
// wrong (every byte checked after the last iteration of the size).
func (x *ipcSide) allgather(ctx context.Context, rank, max int) (per []time.Duration, bad int, err error) {
	dev, ok := x.b.(stream.DeviceIPC)
	if !ok {
		return nil, 0, fmt.Errorf("backend %T has no device IPC", x.b)
	}
	s, err := x.b.NewStream()
	if err != nil {
		return nil, 0, err
	}
	defer s.Close()
	cs, _ := stream.CUDAStream(s)
	sc, err := condition.Create(condition.Param{Category: condition.Stream, Backend: x.b, Stream: s})
	if err != nil {
		return nil, 0, err
	}
	defer sc.Destroy()
	host, err := x.cctx.MemHostAlloc(max/2, cuda.HostAllocPortable)
	if err != nil {
		return nil, 0, err
	}
	defer host.Close()
	prm := &ucp.RequestParam{Condition: sc, MemoryType: ucp.MemoryCUDA}
	peerRank := 1 - rank
	var k uint64 // the signal: allgathers so far, over every size
	for i, n := range allgatherSizes(max) {
		half := n / 2
		mine, theirs := x.own(ipcDataOff+rank*half), x.own(ipcDataOff+peerRank*half)
		value := func(r int) byte { return byte(0x11*(r+1) + 2*i) }
		if err := cs.MemsetD8(mine, value(rank), half); err != nil {
			return nil, 0, err
		}
		if err := cs.MemsetD8(theirs, 0, half); err != nil {
			return nil, 0, err
		}
		if err := s.Synchronize(); err != nil {
			return nil, 0, err
		}
		// The peer zeroes the half this rank writes: no put before it is done.
		if err := x.barrier(ctx, uint64(i)); err != nil {
			return nil, 0, err
		}
		src := ucp.DeviceBuffer(mine, half)
		dst := x.peer.Base() + ipcDataOff + uint64(rank*half)
		step := func() error {
			k++
			if _, err := x.ep.PutSignalNbx(src, dst, x.peer,
				ucp.Signal{Op: ucp.SignalSet, Value: k, Addr: x.peer.Base() + ipcFlag, Rkey: x.peer}, prm); err != nil {
				return err
			}
			if err := dev.WaitValueAt(s, x.own(ipcFlag), k, stream.GEQ); err != nil {
				return err
			}
			if k%ipcWindow == 0 { // bound the waits in flight
				if err := s.Synchronize(); err != nil {
					return err
				}
				x.w.Progress()
			}
			return nil
		}
		for range 2 { // warm, and both ranks in step
			if err := step(); err != nil {
				return nil, 0, err
			}
		}
		if err := s.Synchronize(); err != nil {
			return nil, 0, err
		}
		reps := allgatherReps(n)
		t0 := time.Now()
		for range reps {
			if err := step(); err != nil {
				return nil, 0, err
			}
		}
		if err := s.Synchronize(); err != nil {
			return nil, 0, err
		}
		per = append(per, time.Since(t0)/time.Duration(reps))
		x.w.Progress()
		if err := cs.MemcpyDtoH(host.Addr(), theirs, half); err != nil {
			return nil, 0, err
		}
		if err := cs.Synchronize(); err != nil {
			return nil, 0, err
		}
		if bytes.Count(host.Bytes()[:half], []byte{value(peerRank)}) != half {
			bad++
		}
		// The peer reads its received half before the next size writes into it.
		if err := x.barrier(ctx, uint64(i)|1<<32); err != nil {
			return nil, 0, err
		}
	}
	return per, bad, nil
}

// barrier returns once the peer reached the barrier with the same id.
func (x *ipcSide) barrier(ctx context.Context, id uint64) error {
	var b [8]byte
	r, err := x.w.TagRecvNbx(b[:], tagIPCBarrier|id, ^uint64(0), nil)
	if err != nil {
		return err
	}
	if err := send(ctx, x.ep, nil, tagIPCBarrier|id); err != nil {
		return err
	}
	return r.Wait(ctx)
}

// BenchmarkGPUIPCAllgather2: the 2-rank allgather of 1 MiB to 256 MiB output between
// two processes (on two GPUs under UCPX_TEST_IPC_TWO_GPUS=1), every received byte
// checked on both ranks. algbw = output bytes / time, as nccl-tests report it; the
// NCCL reference is bench/nccl-ref.py in the same device call.
func BenchmarkGPUIPCAllgather2(b *testing.B) {
	g := requireGPU(b)
	const most = 256 << 20
	x, out, _ := startIPCPeer(b, g, "allgather", 0, most)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	per, bad, err := x.allgather(ctx, 0, most)
	require.NoError(b, err, "child output:\n%s", out)
	require.Zero(b, bad, "rank 0: sizes with a wrong byte")
	require.Zero(b, x.result(b, out), "rank 1: sizes with a wrong byte")
	for i, n := range allgatherSizes(most) {
		b.Logf("allgather %4d MiB: %9.2f us  algbw %7.1f GB/s", n>>20,
			float64(per[i].Nanoseconds())/1e3, float64(n)/per[i].Seconds()/1e9)
		b.ReportMetric(float64(n)/per[i].Seconds()/1e9, fmt.Sprintf("%dMiB_algbw_GB/s", n>>20))
	}
	b.ReportMetric(0, "ns/op")
}
