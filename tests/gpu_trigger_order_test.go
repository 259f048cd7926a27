package tests

import (
	"context"
	"encoding/binary"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/cgo/cuda"
	"github.com/ucpx/ucpx/device"
	"github.com/ucpx/ucpx/ucp"
)

// Two handles of one kernel-triggered condition fired newest first from a kernel
// (ucpx_trigger(newer), then ucpx_trigger(older): two kernels finishing in either
// order): the trigger word stays at the newer handle's value and both sends run.
// Before, ucpx_trigger was a plain store: the older handle took the trigger back and
// the newer handle's send was never issued. condition.Trigger is the host twin
// (ucp's TestKernelTriggerOlderHandleAfterNewer).
func TestGPUKernelTriggerNewestFirst(t *testing.T) {
	g := requireGPU(t)
	newestFirst := g.kernel(t, device.KernelTriggerNewestFirst)
	recvW, _, toRecv, _ := shmWorkers(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := 0; i < 20; i++ {
		_, cs, cond, result := g.kernelTriggered(t)
		tag := uint64(0x700 + 2*i)
		s1, err := toRecv.TagSendNbx([]byte("older..."), tag, &ucp.RequestParam{Condition: cond})
		require.NoError(t, err)
		older, err := cond.DeviceHandle()
		require.NoError(t, err)
		s2, err := toRecv.TagSendNbx([]byte("newer..."), tag+1, &ucp.RequestParam{Condition: cond})
		require.NoError(t, err)
		newer, err := cond.DeviceHandle()
		require.NoError(t, err)
		require.NoError(t, cs.LaunchKernel(newestFirst, cuda.Linear(1, 1), newer.Kernel(), older.Kernel(), result.DevicePtr()))
		require.NoError(t, cs.Synchronize())
		words := result.Bytes()
		require.Equal(t, newer.Value, binary.LittleEndian.Uint64(words[8:]), "iteration %d: trigger word after the newer handle", i)
		require.Equal(t, newer.Value, binary.LittleEndian.Uint64(words[0:]), "iteration %d: the older handle took the trigger word back", i)
		buf := make([]byte, 8)
		for _, tg := range []uint64{tag, tag + 1} {
			_, _, err := recvW.TagRecv(ctx, buf, tg, ^uint64(0))
			require.NoError(t, err, "iteration %d: receive of tag %#x", i, tg)
		}
		require.NoError(t, s1.Wait(ctx))
		require.NoError(t, s2.Wait(ctx), "iteration %d: the newer handle's send", i)
	}
}
