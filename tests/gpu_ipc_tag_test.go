package tests

import (
	"context"
	"encoding/binary"
	"hash/crc32"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/cgo/cuda"
	"github.com/ucpx/ucpx/condition"
	"github.com/ucpx/ucpx/protocol"
	"github.com/ucpx/ucpx/stream"
	"github.com/ucpx/ucpx/ucp"
)

// Tag messages of device buffers between two processes of one host: the receiver's
// TagRecvNbx into device memory pulls the data out of the sender's buffer (CUDA IPC)
// after matching, and reports crc32 of what it got.

const (
	tagPullData = 14 << 44 // parent -> child: a message of device memory
	tagPullSum  = 15 << 44 // child -> parent: its crc32 and length
)

// tagReceiver is the child's side: every message of tagPullData is received into
// device memory and its crc32 sent back, until the parent says quit.
func (x *ipcSide) tagReceiver(ctx context.Context) error {
	most, err := strconv.Atoi(os.Getenv(envAMBytes))
	if err != nil {
		return err
	}
	dst, err := x.cctx.MemAlloc(most)
	if err != nil {
		return err
	}
	defer dst.Close()
	host, err := x.cctx.MemHostAlloc(most, cuda.HostAllocPortable)
	if err != nil {
		return err
	}
	defer host.Close()
	s, err := x.b.NewStream()
	if err != nil {
		return err
	}
	defer s.Close()
	cs, _ := stream.CUDAStream(s)
	sc, err := condition.Create(condition.Param{Category: condition.Stream, Backend: x.b, Stream: s})
	if err != nil {
		return err
	}
	defer sc.Destroy()
	quit, err := x.w.TagRecvNbx(make([]byte, 8), tagQuit, ^uint64(0), nil)
	if err != nil {
		return err
	}
	for i := 0; ; i++ {
		// Every other message is received in stream order on s.
		prm := &ucp.RequestParam{MemoryType: ucp.MemoryCUDA}
		if i%2 == 1 {
			prm.Condition = sc
		}
		r, err := x.w.TagRecvNbx(ucp.DeviceBuffer(dst.Ptr(), most), tagPullData, ^uint64(0), prm)
		if err != nil {
			return err
		}
		for !r.Done() && !quit.Done() {
			x.w.Progress()
		}
		if !r.Done() {
			r.Cancel()
			_ = r.Wait(ctx)
			return nil
		}
		if err := r.Err(); err != nil {
			return err
		}
		n := r.Length()
		if err := cs.MemcpyDtoH(host.Addr(), dst.Ptr(), n); err != nil {
			return err
		}
		if err := cs.Synchronize(); err != nil {
			return err
		}
		var out [16]byte
		binary.LittleEndian.PutUint32(out[:], crc32.ChecksumIEEE(host.Bytes()[:n]))
		binary.LittleEndian.PutUint64(out[8:], uint64(n))
		if err := send(ctx, x.ep, out[:], tagPullSum); err != nil {
			return err
		}
	}
}

// TestGPUIPCTagMessages: device buffers as tag messages, 4 B to 1 GiB, sent plain,
// under a Stream condition (after a fill kernel on the stream) and under a
// KernelTriggered condition, received into device memory by the child: by pull
// (nothing staged on the sender; the 4-byte message, shorter than its descriptor,
// is staged), and staged under StageAlways (to 64 MiB); every message's crc32
// compared with the source's.
func TestGPUIPCTagMessages(t *testing.T) {
	g := requireGPU(t)
	const most = 1 << 30
	t.Setenv(envAMBytes, strconv.Itoa(most)) // the child inherits it
	x, out, done := startIPCPeer(t, g, "tag", 0, 0)
	src, err := g.ctx.MemAlloc(most)
	require.NoError(t, err)
	defer src.Close()
	host, err := g.ctx.MemHostAlloc(most, cuda.HostAllocPortable)
	require.NoError(t, err)
	defer host.Close()
	s := g.stream(t)
	cs, _ := stream.CUDAStream(s)
	sc, err := condition.Create(condition.Param{Category: condition.Stream, Backend: g.backend, Stream: s})
	require.NoError(t, err)
	defer func() { require.NoError(t, sc.Destroy()) }()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ks, kcs, kc, result := g.kernelTriggered(t)
	reply := make([]byte, 16)
	seed := uint32(100)
	for _, n := range []int{4, 4096, 64 << 10, 4 << 20, 64 << 20, most} {
		for _, mode := range []string{"plain", "stream", "kernel", "staged"} {
			if mode == "staged" && n > 64<<20 {
				continue
			}
			seed++
			fillOn := cs
			if mode == "kernel" {
				fillOn = kcs
			}
			require.NoError(t, fillOn.LaunchKernel(g.fill, cuda.Linear(256, 256), src.Ptr(), uint64(n), seed))
			prm := &ucp.RequestParam{MemoryType: ucp.MemoryCUDA}
			switch mode {
			case "plain":
				require.NoError(t, s.Synchronize())
			case "stream":
				prm.Condition = sc
			case "kernel":
				prm.Condition = kc
			case "staged":
				require.NoError(t, s.Synchronize())
				prm.Staging = protocol.StageAlways
			}
			rr, err := x.w.TagRecvNbx(reply, tagPullSum, ^uint64(0), nil)
			require.NoError(t, err)
			staged := x.w.StagingStats().Bytes
			t0 := time.Now()
			sr, err := x.ep.TagSendNbx(ucp.DeviceBuffer(src.Ptr(), n), tagPullData, prm)
			require.NoError(t, err, "%s %d", mode, n)
			if mode == "kernel" {
				h, err := kc.DeviceHandle()
				require.NoError(t, err)
				require.NoError(t, kcs.LaunchKernel(g.handle, cuda.Linear(1, 1), h.Kernel(), result.DevicePtr()))
			}
			require.NoError(t, sr.Wait(ctx), "%s %d; child output:\n%s", mode, n, out)
			el := time.Since(t0)
			require.NoError(t, rr.Wait(ctx), "child output:\n%s", out)
			if mode == "kernel" {
				require.NoError(t, ks.Synchronize())
			}
			require.NoError(t, cs.MemcpyDtoH(host.Addr(), src.Ptr(), n))
			require.NoError(t, s.Synchronize())
			want := crc32.ChecksumIEEE(host.Bytes()[:n])
			require.Equal(t, uint64(n), binary.LittleEndian.Uint64(reply[8:]), "%s %d", mode, n)
			require.Equal(t, want, binary.LittleEndian.Uint32(reply), "%s %d: the data the child received", mode, n)
			if mode == "staged" || n < 4096 {
				require.Greater(t, x.w.StagingStats().Bytes, staged, "%s %d: staged", mode, n)
			} else {
				require.Equal(t, staged, x.w.StagingStats().Bytes, "%s %d: pulled, nothing staged", mode, n)
			}
			if n >= 4<<20 {
				t.Logf("%-6s %5d MiB: send to completion %8.1f us (%.1f GB/s)", mode, n>>20,
					float64(el.Nanoseconds())/1e3, float64(n)/el.Seconds()/1e9)
			}
		}
	}
	require.NoError(t, send(ctx, x.ep, nil, tagQuit))
	x.result(t, out)
	<-done
}
