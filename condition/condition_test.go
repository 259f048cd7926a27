package condition_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/condition"
	"github.com/ucpx/ucpx/stream"
)

func backend(t *testing.T) stream.Backend {
	b := stream.NewHostBackend()
	t.Cleanup(func() { _ = b.Close() })
	return b
}

func TestCreateValidates(t *testing.T) {
	b := backend(t)
	s, err := b.NewStream()
	require.NoError(t, err)
	defer s.Close()
	for _, p := range []condition.Param{
		{},
		{Category: condition.Stream, Backend: b},
		{Category: condition.Stream, Stream: s},
		{Category: condition.KernelTriggered},
		{Category: condition.Category(99), Backend: b},
	} {
		_, err := condition.Create(p)
		require.ErrorIs(t, err, condition.ErrInvalidParam, "%+v", p)
	}
	_, err = condition.Create(condition.Param{Category: condition.Graph, Backend: b})
	require.ErrorIs(t, err, condition.ErrInvalidParam) // no graph
}

func TestStreamArmAndRetire(t *testing.T) {
	b := backend(t)
	s, err := b.NewStream()
	require.NoError(t, err)
	defer s.Close()
	c, err := condition.Create(condition.Param{Category: condition.Stream, Backend: b, Stream: s})
	require.NoError(t, err)

	var recorded []uint64
	for i := 0; i < 3; i++ {
		seq, err := c.Arm(true, condition.StreamWork{}, func(seq uint64) { recorded = append(recorded, seq) })
		require.NoError(t, err)
		require.Equal(t, uint64(i+1), seq)
	}
	require.Equal(t, []uint64{1, 2, 3}, recorded)
	var ran atomic.Bool
	require.NoError(t, s.LaunchHostFunc(func() { ran.Store(true) }))

	// The stream stores the first trigger, then waits for completion 1.
	require.Eventually(t, func() bool { return c.TriggerWord().Load() == 1 }, 5*time.Second, time.Millisecond)
	c.Retire(1, nil)
	require.Eventually(t, func() bool { return c.TriggerWord().Load() == 2 }, 5*time.Second, time.Millisecond)
	require.Equal(t, 2, c.Pending())
	require.ErrorIs(t, c.Destroy(), condition.ErrBusy)
	c.Retire(2, errTest)
	c.Retire(3, nil)
	require.NoError(t, s.Synchronize())
	require.True(t, ran.Load())
	require.ErrorIs(t, c.Err(), errTest)
	require.Equal(t, uint64(3), c.CompletionWord().Load())
	require.NoError(t, c.Destroy())
	require.ErrorIs(t, c.Destroy(), condition.ErrDestroyed)
	_, err = c.Arm(true, condition.StreamWork{}, func(uint64) {})
	require.ErrorIs(t, err, condition.ErrDestroyed)
}

var errTest = &testError{}

type testError struct{}

func (*testError) Error() string { return "test error" }

func TestKernelTriggeredHandle(t *testing.T) {
	b := backend(t)
	c, err := condition.Create(condition.Param{Category: condition.KernelTriggered, Backend: b})
	require.NoError(t, err)
	_, err = c.Arm(false, condition.StreamWork{}, func(uint64) {})
	require.NoError(t, err)
	h, err := c.DeviceHandle()
	require.NoError(t, err)
	require.Equal(t, uint64(1), h.Value)
	require.Equal(t, c.TriggerWord().HostPtr(), h.Trigger)
	require.False(t, condition.Test(h))
	require.NoError(t, condition.Trigger(h))
	require.Equal(t, uint64(1), c.TriggerWord().Load())
	c.Retire(1, nil)
	require.True(t, condition.Test(h))
	require.ErrorIs(t, condition.Trigger(condition.DeviceHandle{}), condition.ErrInvalidParam)
	require.NoError(t, c.Destroy())
	_, err = c.DeviceHandle()
	require.ErrorIs(t, err, condition.ErrDestroyed)
}

func TestStreamConditionHasNoDeviceHandle(t *testing.T) {
	b := backend(t)
	s, err := b.NewStream()
	require.NoError(t, err)
	defer s.Close()
	c, err := condition.Create(condition.Param{Category: condition.Stream, Backend: b, Stream: s})
	require.NoError(t, err)
	defer c.Destroy()
	_, err = c.DeviceHandle()
	require.ErrorIs(t, err, condition.ErrInvalidParam)
	require.ErrorIs(t, c.WaitOnStream(nil, 1), condition.ErrInvalidParam)
}

func TestArmOnClosedStreamArmsNothing(t *testing.T) {
	b := backend(t)
	s, err := b.NewStream()
	require.NoError(t, err)
	c, err := condition.Create(condition.Param{Category: condition.Stream, Backend: b, Stream: s})
	require.NoError(t, err)
	require.NoError(t, s.Close())
	called := false
	_, err = c.Arm(true, condition.StreamWork{}, func(uint64) { called = true })
	require.ErrorIs(t, err, stream.ErrClosed)
	require.False(t, called)
	require.Equal(t, 0, c.Pending())
	require.NoError(t, c.Destroy())
}
