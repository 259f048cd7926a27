package tests

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/cgo/cuda"
	"github.com/ucpx/ucpx/condition"
	"github.com/ucpx/ucpx/device"
	"github.com/ucpx/ucpx/stream"
	"github.com/ucpx/ucpx/ucp"
)

// nvFuser's case on one GPU: a pipelined ring allgather of three processes over the
// IPC path. Every iteration each rank frees its receive buffer and allocates a new one
// (the driver hands the same address back or another), sends its key to the rank that
// puts into it, and forwards each chunk with PutSignalNbx as soon as its stream sees
// the chunk arrived; a consumer kernel checksums every chunk of every iteration. No
// barrier: the key message is the only thing a rank waits for.

const (
	envRingRank  = "UCPX_TEST_RING_RANK"
	tagRingAddr  = 8 << 44 // child -> parent: its worker address
	tagRingTable = 9 << 44 // parent -> child: every rank's worker address
	tagRingKey   = 10 << 44
	tagRingDone  = 11 << 44 // child -> parent: its result
	ipcRingRanks = 3
	ipcRingChunk = 256 << 10
	ipcRingIters = 20
	ipcRingFlags = 64 // bytes of flag words before the chunks
)

// ringRank is one rank of the ring.
type ringRank struct {
	rank        int
	b           stream.Backend
	cctx        *cuda.Context
	uctx        *ucp.Context
	w           *ucp.Worker
	left, right *ucp.Endpoint
}

// run does the iterations and returns the number of chunks whose checksum was wrong
// and the distinct receive-buffer addresses it saw.
func (x *ringRank) run(ctx context.Context) (bad, addrs int, err error) {
	mod, err := x.cctx.LoadModule(device.TestKernelsPTX())
	if err != nil {
		return 0, 0, err
	}
	defer mod.Close()
	fill, err := mod.Function(device.KernelFill)
	if err != nil {
		return 0, 0, err
	}
	sum, err := mod.Function(device.KernelChecksum)
	if err != nil {
		return 0, 0, err
	}
	dev := x.b.(stream.DeviceIPC)
	s, err := x.b.NewStream()
	if err != nil {
		return 0, 0, err
	}
	defer s.Close()
	cs, _ := stream.CUDAStream(s)
	sc, err := condition.Create(condition.Param{Category: condition.Stream, Backend: x.b, Stream: s})
	if err != nil {
		return 0, 0, err
	}
	defer sc.Destroy()
	sums, err := x.cctx.MemHostAlloc(8*ipcRingRanks, cuda.HostAllocPortable|cuda.HostAllocDeviceMap)
	if err != nil {
		return 0, 0, err
	}
	defer sums.Close()
	seen := map[uintptr]bool{}
	var mem *cuda.DeviceMemory
	var region *ucp.MemH
	var rightKey *ucp.Rkey
	defer func() {
		if rightKey != nil {
			_ = rightKey.Close()
		}
		if region != nil {
			_ = region.Close()
		}
		if mem != nil {
			_ = mem.Close()
		}
	}()
	size := ipcRingFlags + ipcRingRanks*ipcRingChunk
	for k := 1; k <= ipcRingIters; k++ {
		// A new receive buffer: the old key is revoked (the left rank unmaps it once
		// its copies are flushed), then the memory is freed.
		if region != nil {
			if err := region.Close(); err != nil {
				return 0, 0, fmt.Errorf("iteration %d: %w", k, err)
			}
			if err := mem.Close(); err != nil {
				return 0, 0, err
			}
		}
		// Every third iteration a spacer holds the freed range, so the new buffer
		// lands elsewhere; otherwise the driver hands the same address back.
		var spacer *cuda.DeviceMemory
		if k%3 == 0 {
			if spacer, err = x.cctx.MemAlloc(size); err != nil {
				return 0, 0, err
			}
		}
		mem, err = x.cctx.MemAlloc(size)
		if spacer != nil {
			_ = spacer.Close()
		}
		if err != nil {
			return 0, 0, err
		}
		seen[mem.Ptr()] = true
		if err := cs.MemsetD8(mem.Ptr(), 0, ipcRingFlags); err != nil {
			return 0, 0, err
		}
		if err := cs.Synchronize(); err != nil {
			return 0, 0, err
		}
		if region, err = x.uctx.MemMapPtr(mem.Ptr(), size, ucp.MemoryCUDA); err != nil {
			return 0, 0, err
		}
		packed, err := region.PackRkey()
		if err != nil {
			return 0, 0, err
		}
		kb := make([]byte, 4096)
		kr, err := x.w.TagRecvNbx(kb, tagRingKey|uint64(k), ^uint64(0), &ucp.RequestParam{Peer: x.right})
		if err != nil {
			return 0, 0, err
		}
		if err := send(ctx, x.left, packed, tagRingKey|uint64(k)); err != nil {
			return 0, 0, err
		}
		if err := kr.Wait(ctx); err != nil {
			return 0, 0, err
		}
		if rightKey != nil {
			if err := rightKey.Close(); err != nil {
				return 0, 0, err
			}
		}
		if rightKey, err = x.right.UnpackRkey(kb[:kr.Length()]); err != nil {
			return 0, 0, err
		}
		slot := func(j int) uintptr { return mem.Ptr() + ipcRingFlags + uintptr(j*ipcRingChunk) }
		flag := func(j int) uintptr { return mem.Ptr() + uintptr(8*j) }
		if err := cs.LaunchKernel(fill, cuda.Linear(64, 256), slot(x.rank), uint64(ipcRingChunk), uint32(1000*k+x.rank)); err != nil {
			return 0, 0, err
		}
		prm := &ucp.RequestParam{Condition: sc, MemoryType: ucp.MemoryCUDA}
		for st := 0; st < ipcRingRanks-1; st++ {
			j := (x.rank - st + ipcRingRanks) % ipcRingRanks
			if st > 0 {
				if err := dev.WaitValueAt(s, flag(j), uint64(k), stream.GEQ); err != nil {
					return 0, 0, err
				}
			}
			_, err := x.right.PutSignalNbx(ucp.DeviceBuffer(slot(j), ipcRingChunk), rightKey.Base()+ipcRingFlags+uint64(j*ipcRingChunk), rightKey,
				ucp.Signal{Op: ucp.SignalSet, Value: uint64(k), Addr: rightKey.Base() + uint64(8*j), Rkey: rightKey}, prm)
			if err != nil {
				return 0, 0, fmt.Errorf("iteration %d step %d: %w", k, st, err)
			}
		}
		// The consumer: every chunk of this iteration, checksummed on the GPU.
		clear(sums.Bytes())
		for j := range ipcRingRanks {
			if j != x.rank {
				if err := dev.WaitValueAt(s, flag(j), uint64(k), stream.GEQ); err != nil {
					return 0, 0, err
				}
			}
			if err := cs.LaunchKernel(sum, cuda.Linear(64, 256), slot(j), uint64(ipcRingChunk), sums.DevicePtr()+uintptr(8*j)); err != nil {
				return 0, 0, err
			}
		}
		if err := cs.Synchronize(); err != nil {
			return 0, 0, err
		}
		for j := range ipcRingRanks {
			var want uint64
			for i := range ipcRingChunk {
				want += uint64(device.Pattern(uint64(i), uint32(1000*k+j)))
			}
			if binary.LittleEndian.Uint64(sums.Bytes()[8*j:]) != want {
				bad++
			}
		}
	}
	// The right rank revokes our key of its last buffer when it closes: keep
	// progressing until everyone is done (the caller's last exchange).
	return bad, len(seen), nil
}

// newRingRank opens rank's CUDA backend, context (with the device) and worker.
func newRingRank(rank int, b stream.Backend) (*ringRank, error) {
	x := &ringRank{rank: rank, b: b}
	x.cctx, _, _ = stream.CUDAContext(b)
	var err error
	if x.uctx, err = ucp.NewContext(ucp.ContextParams{Device: b}); err != nil {
		return nil, err
	}
	if x.w, err = x.uctx.NewWorker(ucp.WorkerParams{ProgressThread: true}); err != nil {
		_ = x.uctx.Close()
		return nil, err
	}
	return x, nil
}

// connect makes the endpoints to both neighbours from the address table.
func (x *ringRank) connect(table [][]byte) error {
	var err error
	if x.right, err = x.w.ConnectAddress(table[(x.rank+1)%ipcRingRanks], nil); err != nil {
		return err
	}
	x.left, err = x.w.ConnectAddress(table[(x.rank+ipcRingRanks-1)%ipcRingRanks], nil)
	return err
}

func encodeTable(table [][]byte) []byte {
	var out []byte
	for _, a := range table {
		out = binary.LittleEndian.AppendUint32(out, uint32(len(a)))
		out = append(out, a...)
	}
	return out
}

func decodeTable(b []byte) ([][]byte, error) {
	var table [][]byte
	for len(b) >= 4 {
		n := int(binary.LittleEndian.Uint32(b))
		if n > len(b)-4 {
			return nil, fmt.Errorf("address table: entry of %d bytes in %d", n, len(b)-4)
		}
		table = append(table, b[4:4+n])
		b = b[4+n:]
	}
	if len(table) != ipcRingRanks {
		return nil, fmt.Errorf("address table of %d ranks", len(table))
	}
	return table, nil
}

// runRingChild is ranks 1 and 2.
func runRingChild() error {
	rank, err := strconv.Atoi(os.Getenv(envRingRank))
	if err != nil {
		return err
	}
	b, err := openChildBackend()
	if err != nil {
		return err
	}
	defer b.Close()
	x, err := newRingRank(rank, b)
	if err != nil {
		return err
	}
	defer x.uctx.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	parent, err := x.w.Connect(ctx, os.Getenv(envListenAddr), nil)
	if err != nil {
		return err
	}
	self, err := x.w.Address()
	if err != nil {
		return err
	}
	tb := make([]byte, 64<<10)
	tr, err := x.w.TagRecvNbx(tb, tagRingTable, ^uint64(0), nil)
	if err != nil {
		return err
	}
	if err := send(ctx, parent, self, tagRingAddr|uint64(rank)); err != nil {
		return err
	}
	if err := tr.Wait(ctx); err != nil {
		return err
	}
	table, err := decodeTable(tb[:tr.Length()])
	if err != nil {
		return err
	}
	if err := x.connect(table); err != nil {
		return err
	}
	bad, addrs, err := x.run(ctx)
	if err != nil {
		return err
	}
	var out [16]byte
	binary.LittleEndian.PutUint64(out[:], uint64(bad))
	binary.LittleEndian.PutUint64(out[8:], uint64(addrs))
	if err := send(ctx, parent, out[:], tagRingDone|uint64(rank)); err != nil {
		return err
	}
	qb := make([]byte, 8)
	qr, err := x.w.TagRecvNbx(qb, tagQuit, ^uint64(0), nil)
	if err != nil {
		return err
	}
	return qr.Wait(ctx)
}

func TestGPUIPCRingAllgatherRealloc(t *testing.T) {
	g := requireGPU(t)
	x, err := newRingRank(0, g.backend)
	require.NoError(t, err)
	defer x.uctx.Close()
	l, err := x.w.Listen("127.0.0.1:0", nil)
	require.NoError(t, err)
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	outs := make([]*childOutput, ipcRingRanks)
	var children []*ucp.Endpoint
	for r := 1; r < ipcRingRanks; r++ {
		var ep *ucp.Endpoint
		_, onGPU := childGPU(t, r)
		ep, outs[r], _ = spawnRole(t, l, "ring", nil, envRingRank+"="+strconv.Itoa(r), onGPU)
		children = append(children, ep)
	}
	table := make([][]byte, ipcRingRanks)
	table[0], err = x.w.Address()
	require.NoError(t, err)
	for r := 1; r < ipcRingRanks; r++ {
		b := make([]byte, 64<<10)
		rr, err := x.w.TagRecvNbx(b, tagRingAddr|uint64(r), ^uint64(0), nil)
		require.NoError(t, err)
		require.NoError(t, rr.Wait(ctx), "rank %d output:\n%s", r, outs[r])
		table[r] = b[:rr.Length()]
	}
	for _, ep := range children {
		require.NoError(t, send(ctx, ep, encodeTable(table), tagRingTable))
	}
	require.NoError(t, x.connect(table))
	bad, addrs, err := x.run(ctx)
	require.NoError(t, err, "rank 1:\n%s\nrank 2:\n%s", outs[1], outs[2])
	require.Zero(t, bad, "rank 0: wrong chunks")
	t.Logf("rank 0: %d iterations, %d distinct buffer addresses", ipcRingIters, addrs)
	for r := 1; r < ipcRingRanks; r++ {
		var res [16]byte
		rr, err := x.w.TagRecvNbx(res[:], tagRingDone|uint64(r), ^uint64(0), nil)
		require.NoError(t, err)
		require.NoError(t, rr.Wait(ctx), "rank %d output:\n%s", r, outs[r])
		require.Zero(t, binary.LittleEndian.Uint64(res[:]), "rank %d: wrong chunks", r)
		t.Logf("rank %d: %d distinct buffer addresses", r, binary.LittleEndian.Uint64(res[8:]))
	}
	for _, ep := range children {
		require.NoError(t, send(ctx, ep, nil, tagQuit))
	}
}
