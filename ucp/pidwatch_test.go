package ucp

import (
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// statExiting reads the state and flags fields after the command name, whatever the
// name holds.
func TestStatExiting(t *testing.T) {
	for _, c := range []struct {
		stat string
		want bool
	}{
		{"1234 (sleep) S 1 1234 1234 0 -1 4194304 97 0 0 0", false},
		{"1234 (sleep) S 1 1234 1234 0 -1 4194308 97 0 0 0", true}, // PF_EXITING
		{"1234 (a b) (c)) R 1 1234 1234 0 -1 4 97 0 0 0", true},    // ')' in the name
		{"1234 (a b) (c)) R 1 1234 1234 0 -1 64 97 0 0 0", false},  //
		{"1234 (zombie) Z 1 1234 1234 0 -1 4194560 0 0 0 0", true}, // exited, not reaped
		{"1234 (dead) X 1 1234 1234 0 -1 0 0 0 0 0", true},         // being reaped
		{"1234 (short) S 1", false},                                // truncated
		{"garbage", false},                                         //
		{"1234 (x) S 1 1234 1234 0 -1 notanumber 0 0 0 0", false},  //
	} {
		require.Equal(t, c.want, statExiting([]byte(c.stat)), c.stat)
	}
	self, err := os.ReadFile("/proc/self/stat")
	require.NoError(t, err)
	require.False(t, statExiting(self), "this process is not exiting: %s", self)
}

// A watch reports a live peer as live and a dead one as exited.
func TestPidWatchExited(t *testing.T) {
	cmd := exec.Command("sleep", "30")
	require.NoError(t, cmd.Start())
	defer func() { _ = cmd.Process.Kill() }()
	fd, err := unix.PidfdOpen(cmd.Process.Pid, unix.PIDFD_NONBLOCK)
	if err != nil {
		t.Skipf("no pidfd: %v", err)
	}
	f := os.NewFile(uintptr(fd), "pidfd")
	defer f.Close()
	rc, err := f.SyscallConn()
	require.NoError(t, err)
	w := &pidWatch{f: f, rc: rc, pid: cmd.Process.Pid}
	require.False(t, w.exited(), "a sleeping child")
	require.NoError(t, cmd.Process.Kill())
	require.Eventually(t, w.exited, 10*time.Second, time.Millisecond, "a killed child (a zombie until waited for)")
	_, _ = cmd.Process.Wait()
	require.True(t, w.exited(), "a reaped child")
}
