package ucp

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/condition"
)

// Request.Cancel of a KernelTriggered operation whose kernel never triggers it
// completes it with ErrCanceled, and the condition can then be destroyed. Before, the
// engine's round stopped at the first part without its trigger and never looked at
// its cancel: the Request stayed pending and Destroy refused (ErrBusy) for good.
func TestCancelUntriggeredKernelOperation(t *testing.T) {
	_, w, _ := selfLoop(t, WorkerParams{})
	kc, err := condition.Create(condition.Param{Category: condition.KernelTriggered, Backend: hostBackend(t)})
	require.NoError(t, err)
	r, err := w.TagRecvNbx(make([]byte, 8), 7, ^uint64(0), &RequestParam{Condition: kc})
	require.NoError(t, err)
	h, err := kc.DeviceHandle()
	require.NoError(t, err)
	r.Cancel()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.ErrorIs(t, r.Wait(ctx), ErrCanceled, "the canceled operation completes")
	require.True(t, condition.Test(h), "its completion value is reached")
	done, opErr := kc.StatusAt(h.CompletionValue)
	require.True(t, done)
	require.ErrorIs(t, opErr, ErrCanceled)
	require.Zero(t, kc.Pending())
	// A late trigger of the canceled operation's handle issues nothing.
	require.NoError(t, condition.Trigger(h))
	require.NoError(t, kc.Destroy())
}

// Canceling the middle one of three kernel-triggered receives, none triggered: it
// completes (ErrCanceled) only after the first, in sequence order, and the third
// still waits for its own trigger; the handle of the third (fetched after the
// cancel, or before it) starts it, and a late trigger of the canceled one's handle
// changes nothing.
func TestCancelUntriggeredKernelOperationKeepsOrder(t *testing.T) {
	_, w, ep := selfLoop(t, WorkerParams{})
	kc, err := condition.Create(condition.Param{Category: condition.KernelTriggered, Backend: hostBackend(t)})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	bufs := [3][]byte{make([]byte, 8), make([]byte, 8), make([]byte, 8)}
	var rs [3]*Request
	var hs [3]condition.DeviceHandle
	for i := range rs {
		rs[i], err = w.TagRecvNbx(bufs[i], uint64(20+i), ^uint64(0), &RequestParam{Condition: kc})
		require.NoError(t, err)
		hs[i], err = kc.DeviceHandle()
		require.NoError(t, err)
	}
	rs[1].Cancel()
	for i := 0; i < 100; i++ {
		_, _ = rs[1].Test()
	}
	require.False(t, rs[1].Done(), "retired before the operation armed before it")
	require.NoError(t, condition.Trigger(hs[0]))
	s0, err := ep.TagSendNbx([]byte("zero...."), 20, nil)
	require.NoError(t, err)
	require.NoError(t, rs[0].Wait(ctx))
	require.NoError(t, s0.Wait(ctx))
	require.ErrorIs(t, rs[1].Wait(ctx), ErrCanceled)
	require.True(t, condition.Test(hs[1]))
	require.False(t, rs[2].Done(), "the third waits for its own trigger")
	require.Equal(t, 1, kc.Pending())

	require.NoError(t, condition.Trigger(hs[1])) // late: nothing to issue
	for i := 0; i < 100; i++ {
		_, _ = rs[2].Test()
	}
	require.False(t, rs[2].Done())
	require.NoError(t, condition.Trigger(hs[2]))
	s2, err := ep.TagSendNbx([]byte("two....."), 22, nil)
	require.NoError(t, err)
	require.NoError(t, rs[2].Wait(ctx))
	require.NoError(t, s2.Wait(ctx))
	require.Equal(t, "two.....", string(bufs[2]))
	require.Zero(t, kc.Pending())
	require.NoError(t, kc.Destroy())
}
