package backoff

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestPause(t *testing.T) {
	start := time.Now()
	require.True(t, Spinning(start))
	Pause(start) // a yield

	old := time.Now().Add(-2 * SpinFor)
	require.False(t, Spinning(old))
	t0 := time.Now()
	Pause(old)
	require.GreaterOrEqual(t, time.Since(t0), time.Millisecond, "after the spin phase a pause sleeps")
}

func TestPauseOn(t *testing.T) {
	slept := 0
	sleep := func() { slept++ }
	PauseOn(time.Now(), sleep)
	require.Zero(t, slept, "spinning: a yield, no sleep")
	PauseOn(time.Now().Add(-2*SpinFor), sleep)
	require.Equal(t, 1, slept, "after the spin phase the wait's own sleep")
}
