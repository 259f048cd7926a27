package pingpong

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/condition"
	"github.com/ucpx/ucpx/stream"
	"github.com/ucpx/ucpx/ucp"
)

func hostCondition(t *testing.T) *condition.Condition {
	b, err := stream.Open(stream.Host)
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	c, err := condition.Create(condition.Param{Category: condition.KernelTriggered, Backend: b})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Destroy() })
	return c
}

// The caller is released by the last operation's completion store, which comes before
// that operation's callback: Verify waits for the callbacks still running.
func TestVerifyWaitsForLateCallbacks(t *testing.T) {
	cond := hostCondition(t)
	c := NewCheck(0, 4) // a zero Request has no error and length 0
	const count = 3
	for range count - 1 {
		c.sent(&ucp.Request{})
		c.received(&ucp.Request{})
	}
	go func() {
		time.Sleep(20 * time.Millisecond)
		c.sent(&ucp.Request{})
		c.received(&ucp.Request{})
	}()
	require.NoError(t, c.Verify(cond, count))
}

// A receive that never completes is reported once the grace has passed.
func TestVerifyReportsMissingReceive(t *testing.T) {
	cond := hostCondition(t)
	c := NewCheck(0, 4)
	c.sent(&ucp.Request{})
	start := time.Now()
	err := c.Verify(cond, 1)
	require.True(t, errors.Is(err, ErrCheck), "%v", err)
	require.ErrorContains(t, err, "1 sends and 0 receives completed")
	require.GreaterOrEqual(t, time.Since(start), callbackGrace)
}

// A failed check does not wait out the grace.
func TestVerifyReportsWrongLength(t *testing.T) {
	cond := hostCondition(t)
	c := NewCheck(8, 4)
	c.received(&ucp.Request{})
	start := time.Now()
	err := c.Verify(cond, 1)
	require.ErrorIs(t, err, ErrCheck)
	require.ErrorContains(t, err, "received 0 bytes, want 8")
	require.Less(t, time.Since(start), callbackGrace)
}
