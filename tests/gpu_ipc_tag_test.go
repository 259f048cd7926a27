package tests

import (
	"context"
	"encoding/binary"
	"hash/crc32"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/condition"
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
	dst, host, release, err := x.sinkBuffers()
	if err != nil {
		return err
	}
	defer release()
	most := len(host.Bytes())
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

// TestGPUIPCTagMessages: device buffers as tag messages (deviceMessageSweep),
// received into device memory by the child: by pull (nothing staged on the sender;
// the 4-byte message, shorter than its descriptor, and conditioned ones under 4 KiB
// are staged), and staged under StageAlways.
func TestGPUIPCTagMessages(t *testing.T) {
	deviceMessageSweep(t, "tag", tagPullSum,
		func(x *ipcSide, _ string, buf []byte, prm *ucp.RequestParam) (*ucp.Request, error) {
			return x.ep.TagSendNbx(buf, tagPullData, prm)
		},
		func(t *testing.T, x *ipcSide, mode string, n int, _ []byte, staged uint64) {
			if mode == "staged" || n < 4096 {
				require.Greater(t, x.w.StagingStats().Bytes, staged, "%s %d: staged", mode, n)
			} else {
				require.Equal(t, staged, x.w.StagingStats().Bytes, "%s %d: pulled, nothing staged", mode, n)
			}
		})
}
