package cuda

import (
	"os"
	"testing"

	"github.com/stretchr/testify/require"
)

// Load gives CUDA 32 hardware queues unless the environment chose a number.
func TestSetConnections(t *testing.T) {
	t.Setenv(ConnectionsEnv, "") // restores the variable after the test
	require.NoError(t, os.Unsetenv(ConnectionsEnv))
	setConnections()
	require.Equal(t, DefaultConnections, os.Getenv(ConnectionsEnv))

	t.Setenv(ConnectionsEnv, "4")
	setConnections()
	require.Equal(t, "4", os.Getenv(ConnectionsEnv))

	t.Setenv(ConnectionsEnv, "") // empty: CUDA would use its default
	setConnections()
	require.Equal(t, DefaultConnections, os.Getenv(ConnectionsEnv))
}
