package runahead

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Ahead lets the host run exactly window iterations ahead, then blocks until half a
// window completes.
func TestAheadBlocksAtTheWindow(t *testing.T) {
	ctx := context.Background()
	th := New(4)
	for i := 0; i < 4; i++ {
		require.NoError(t, th.Ahead(ctx, i, 100))
	}
	released := make(chan error, 1)
	go func() { released <- th.Ahead(ctx, 4, 100) }()
	select {
	case err := <-released:
		require.FailNowf(t, "iteration 4 ran with none completed", "err %v", err)
	case <-time.After(20 * time.Millisecond):
	}
	th.Done() // 1 completed: not yet half a window, no wake-up
	th.Done() // 2: iteration 4 is within the window again
	select {
	case err := <-released:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		require.FailNow(t, "iteration 4 still blocked with 2 of 4 completed")
	}
	require.Equal(t, int64(2), th.Completed())
}

// ArmAhead arms iterations 1..count-1, never window or more beyond the completed ones.
func TestArmAheadKeepsTheWindow(t *testing.T) {
	const window, count = 8, 100
	th := New(window)
	var armed, maxAhead atomic.Int64
	armed.Store(1) // iteration 0 is armed before ArmAhead, as for a kernel's handle
	done := make(chan struct{})
	go func() {
		// The "kernel" completes only once the host is a full window ahead (or
		// everything is armed), then half a window at a time: the Throttle wakes the
		// host every half window, so a kernel completing less could leave it asleep.
		defer close(done)
		for th.Completed() < count {
			a := armed.Load()
			switch {
			case a == count:
				th.Done()
			case a-th.Completed() >= window:
				for range window / 2 {
					th.Done()
				}
			}
		}
	}()
	err := th.ArmAhead(context.Background(), count, func() error {
		n := armed.Add(1)
		if d := n - th.Completed(); d > maxAhead.Load() {
			maxAhead.Store(d)
		}
		return nil
	})
	require.NoError(t, err)
	<-done
	require.Equal(t, int64(count), armed.Load())
	require.LessOrEqual(t, maxAhead.Load(), int64(window), "the host ran past the window")
}

// A canceled context ends a blocked wait with its cause; an arm error ends ArmAhead.
func TestRunaheadErrors(t *testing.T) {
	th := New(2)
	ctx, cancel := context.WithCancelCause(context.Background())
	cause := errors.New("run stopped")
	cancel(cause)
	err := th.Ahead(ctx, 2, 10)
	require.ErrorIs(t, err, cause)
	require.Contains(t, err.Error(), "after 0 of 10 iterations")
	armErr := errors.New("arm failed")
	require.ErrorIs(t, New(2).ArmAhead(context.Background(), 5, func() error { return armErr }), armErr)
}
