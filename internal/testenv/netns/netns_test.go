package netns

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// Two hosts reach each other only over eth0, see different hostnames, PID and IPC
// namespaces and /dev/shm.
func TestTwoHosts(t *testing.T) {
	c := New(t, 2, nil)
	a, b := c.Hosts[0], c.Hosts[1]
	out, err := a.Run("hostname")
	require.NoError(t, err, "%s", out)
	require.Equal(t, "host0", strings.TrimSpace(string(out)))
	out, err = a.Run("sh", "-c", "cat /proc/1/comm; ls /dev/shm | wc -l; touch /dev/shm/x")
	require.NoError(t, err, "%s", out)
	// The PID namespace's first process is the holder; /dev/shm is the host's own.
	require.Equal(t, []string{"sleep", "0"}, strings.Fields(string(out)))
	out, err = b.Run("ls", "/dev/shm")
	require.NoError(t, err, "%s", out)
	require.Empty(t, strings.TrimSpace(string(out)), "host1 sees host0's /dev/shm")
	before, err := a.Stats()
	require.NoError(t, err)
	_, _ = a.Run("bash", "-c", "exec 3<>/dev/tcp/"+b.IP+"/1")
	out, err = b.Run("ip", "-o", "-4", "addr", "show", "dev", Dev)
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), b.IP+"/24")
	after, err := a.Stats()
	require.NoError(t, err)
	require.Greater(t, after.TxBytes, before.TxBytes, "a connection attempt to host1 left eth0")
	require.NoError(t, a.SetLink(false))
	out, err = a.Run("ip", "-o", "link", "show", "dev", Dev)
	require.NoError(t, err)
	require.NotContains(t, string(out), "state UP")
	require.NoError(t, a.SetLink(true))
	// The host's /sys shows its own devices only (UCX looks there for UCX_NET_DEVICES).
	out, err = b.Run("ls", "/sys/class/net")
	require.NoError(t, err, "%s", out)
	require.ElementsMatch(t, []string{"eth0", "lo"}, strings.Fields(string(out)))
}
