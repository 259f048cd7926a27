package ucp

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/condition"
)

// Two handles of one KernelTriggered condition triggered newest first (two kernels
// finishing in either order): the trigger word only moves forward, so the older
// handle changes nothing and both sends run. Before, condition.Trigger stored the
// older value over the newer one and the second send was never issued.
// tests.TestGPUKernelTriggerNewestFirst checks ucpx_trigger on a GPU.
func TestKernelTriggerOlderHandleAfterNewer(t *testing.T) {
	_, w, ep := selfLoop(t, WorkerParams{})
	stuck := 0
	for i := 0; i < 20; i++ {
		kc, err := condition.Create(condition.Param{Category: condition.KernelTriggered, Backend: hostBackend(t)})
		require.NoError(t, err)
		tag := uint64(100 + i*2)
		r1, err := ep.TagSendNbx([]byte("one....."), tag, &RequestParam{Condition: kc})
		require.NoError(t, err)
		h1, err := kc.DeviceHandle()
		require.NoError(t, err)
		r2, err := ep.TagSendNbx([]byte("two....."), tag+1, &RequestParam{Condition: kc})
		require.NoError(t, err)
		h2, err := kc.DeviceHandle()
		require.NoError(t, err)
		require.NoError(t, condition.Trigger(h2)) // the newer kernel first
		require.NoError(t, condition.Trigger(h1))
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		require.NoError(t, r1.Wait(ctx))
		err = r2.Wait(ctx)
		cancel()
		if err != nil {
			stuck++
			t.Logf("iteration %d: second send not issued after both handles triggered: %v (Pending=%d)", i, err, kc.Pending())
			require.NoError(t, condition.Trigger(h2)) // release it
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			require.NoError(t, r2.Wait(ctx))
			cancel()
		}
		buf := make([]byte, 8)
		ctx, cancel = context.WithTimeout(context.Background(), 5*time.Second)
		_, _, err = w.TagRecv(ctx, buf, tag, ^uint64(0))
		require.NoError(t, err)
		require.Equal(t, "one.....", string(buf))
		_, _, err = w.TagRecv(ctx, buf, tag+1, ^uint64(0))
		require.NoError(t, err)
		require.Equal(t, "two.....", string(buf))
		cancel()
		require.NoError(t, kc.Destroy())
	}
	require.Zero(t, stuck, "a trigger with an older handle took the trigger word back")
}
