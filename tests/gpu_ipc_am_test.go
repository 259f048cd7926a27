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

// Active messages of device buffers between two processes of one host: the receiver
// pulls the data out of the sender's buffer (CUDA IPC) into its own device buffer and
// reports crc32 of what it got.

const (
	amPullID   = 21
	tagAMSum   = 13 << 44 // child -> parent: crc32 and length of a received message
	envAMBytes = "UCPX_TEST_AM_BYTES"
)

// amReceiver is the child's side: every message on amPullID is received into device
// memory (RecvData, MemoryCUDA) and its crc32 sent back, until the parent says quit.
func (x *ipcSide) amReceiver(ctx context.Context) error {
	dst, host, release, err := x.sinkBuffers()
	if err != nil {
		return err
	}
	defer release()
	s, err := x.cctx.NewStream(cuda.StreamNonBlocking, 0)
	if err != nil {
		return err
	}
	defer s.Close()
	msgs := make(chan *ucp.AmMessage, 4)
	if err := x.w.SetAmHandler(amPullID, func(m *ucp.AmMessage) {
		m.Retain()
		msgs <- m
	}); err != nil {
		return err
	}
	quit, err := x.w.TagRecvNbx(make([]byte, 8), tagQuit, ^uint64(0), nil)
	if err != nil {
		return err
	}
	for !quit.Done() {
		select {
		case m := <-msgs:
			n := m.Length()
			r, err := m.RecvData(ucp.DeviceBuffer(dst.Ptr(), n), &ucp.RequestParam{MemoryType: ucp.MemoryCUDA})
			if err != nil {
				return err
			}
			if err := r.Wait(ctx); err != nil {
				return err
			}
			if err := s.MemcpyDtoH(host.Addr(), dst.Ptr(), n); err != nil {
				return err
			}
			if err := s.Synchronize(); err != nil {
				return err
			}
			var out [16]byte
			binary.LittleEndian.PutUint32(out[:], crc32.ChecksumIEEE(host.Bytes()[:n]))
			binary.LittleEndian.PutUint64(out[8:], uint64(n))
			binary.LittleEndian.PutUint32(out[4:], boolWord(m.IsRendezvous()))
			if err := send(ctx, x.ep, out[:], tagAMSum); err != nil {
				return err
			}
		default:
			x.w.Progress()
		}
	}
	return nil
}

// sinkBuffers are a receiving child's device buffer for messages of up to
// UCPX_TEST_AM_BYTES and the pinned host memory it copies them to for their crc32.
func (x *ipcSide) sinkBuffers() (dst *cuda.DeviceMemory, host *cuda.HostMemory, release func(), err error) {
	most, err := strconv.Atoi(os.Getenv(envAMBytes))
	if err != nil {
		return nil, nil, nil, err
	}
	if dst, err = x.cctx.MemAlloc(most); err != nil {
		return nil, nil, nil, err
	}
	if host, err = x.cctx.MemHostAlloc(most, cuda.HostAllocPortable); err != nil {
		_ = dst.Close()
		return nil, nil, nil, err
	}
	return dst, host, func() { _ = host.Close(); _ = dst.Close() }, nil
}

func boolWord(b bool) uint32 {
	if b {
		return 1
	}
	return 0
}

// TestGPUIPCActiveMessages: device buffers as active messages (deviceMessageSweep),
// received into device memory by the child's RecvData: by pull (nothing staged on
// the sender), and staged under StageAlways.
func TestGPUIPCActiveMessages(t *testing.T) {
	deviceMessageSweep(t, "am", tagAMSum,
		func(x *ipcSide, mode string, buf []byte, prm *ucp.RequestParam) (*ucp.Request, error) {
			return x.ep.AmSendNbx(amPullID, []byte(mode), buf, prm)
		},
		func(t *testing.T, x *ipcSide, mode string, n int, reply []byte, staged uint64) {
			pulled := binary.LittleEndian.Uint32(reply[4:]) == 1
			if mode == "staged" {
				require.Greater(t, x.w.StagingStats().Bytes, staged, "StageAlways stages")
			} else {
				require.True(t, pulled, "%s %d: pulled", mode, n)
				require.Equal(t, staged, x.w.StagingStats().Bytes, "%s %d: nothing staged", mode, n)
			}
		})
}

// deviceMessageSweep sends the child (started with scenario, which receives into
// device memory and answers each message with its crc32 and length on sumTag) device
// buffers of 4 B to 1 GiB with sendMsg: plain, under a Stream condition (after a fill
// kernel on the stream), under a KernelTriggered condition (a kernel after the fill
// triggers the send and waits for its completion) and under StageAlways (to 64 MiB).
// Every message's crc32 is compared with the source's; check sees each reply with the
// sender's staged bytes before the send.
func deviceMessageSweep(t *testing.T, scenario string, sumTag uint64,
	sendMsg func(x *ipcSide, mode string, buf []byte, prm *ucp.RequestParam) (*ucp.Request, error),
	check func(t *testing.T, x *ipcSide, mode string, n int, reply []byte, staged uint64)) {
	g := requireGPU(t)
	const most = 1 << 30
	t.Setenv(envAMBytes, strconv.Itoa(most)) // the child inherits it
	x, out, done := startIPCPeer(t, g, scenario, 0, 0)
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
	seed := uint32(0)
	for _, n := range []int{4, 4096, 64 << 10, 4 << 20, 64 << 20, most} {
		for _, mode := range []string{"plain", "stream", "kernel", "staged"} {
			if mode == "staged" && n > 64<<20 {
				continue // pinned staging of a GiB on both sides: nothing more to learn
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
				prm.Condition = sc // issued when the stream got past the fill
			case "kernel":
				prm.Condition = kc // issued when the kernel after the fill triggers it
			case "staged":
				require.NoError(t, s.Synchronize())
				prm.Staging = protocol.StageAlways
			}
			rr, err := x.w.TagRecvNbx(reply, sumTag, ^uint64(0), nil)
			require.NoError(t, err)
			staged := x.w.StagingStats().Bytes
			t0 := time.Now()
			sr, err := sendMsg(x, mode, ucp.DeviceBuffer(src.Ptr(), n), prm)
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
				require.NoError(t, ks.Synchronize()) // the kernel saw the completion
			}
			require.NoError(t, cs.MemcpyDtoH(host.Addr(), src.Ptr(), n))
			require.NoError(t, s.Synchronize())
			want := crc32.ChecksumIEEE(host.Bytes()[:n])
			require.Equal(t, uint64(n), binary.LittleEndian.Uint64(reply[8:]), "%s %d", mode, n)
			require.Equal(t, want, binary.LittleEndian.Uint32(reply), "%s %d: the data the child received", mode, n)
			check(t, x, mode, n, reply, staged)
			if n >= 4<<20 {
				t.Logf("%-6s %5d MiB: send to completion %8.1f us (%.1f GB/s)", mode, n>>20,
					float64(el.Nanoseconds())/1e3, float64(n)/el.Seconds()/1e9)
			}
		}
	}
	require.NoError(t, send(ctx, x.ep, nil, tagQuit)) // ends the child's receiving
	x.result(t, out)
	<-done
}
