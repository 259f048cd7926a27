package main

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/bootstrap"
)

// startLaunch starts `ucpx launch args...` (this test binary) with no auth key file
// in its environment, and returns it once every rank printed "ready" (or its key
// file's path, for ranks that print it), with those lines.
func startLaunch(t *testing.T, ranks int, args ...string) (*exec.Cmd, []string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], append([]string{"launch"}, args...)...)
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, bootstrap.EnvAuthKeyFile+"=") {
			cmd.Env = append(cmd.Env, e)
		}
	}
	cmd.Env = append(cmd.Env, reexecEnv+"=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })
	lines := make(chan string, ranks)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	var got []string
	for len(got) < ranks {
		select {
		case l, ok := <-lines:
			require.True(t, ok, "launch ended before its ranks were ready: %q", got)
			got = append(got, l)
		case <-time.After(30 * time.Second):
			t.Fatalf("ranks not ready within 30 s: %q", got)
		}
	}
	go func() {
		for range lines {
		}
	}()
	return cmd, got
}

// waitExit waits up to d for cmd to end.
func waitExit(t *testing.T, cmd *exec.Cmd, d time.Duration) bool {
	t.Helper()
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	select {
	case <-done:
		return true
	case <-time.After(d):
		return false
	}
}

// SIGHUP (a closed terminal) is passed on to the ranks like SIGINT and SIGTERM, and
// the launcher removes the job's key before it exits: the key was left behind.
func TestLaunchSIGHUPRemovesTheKey(t *testing.T) {
	cmd, lines := startLaunch(t, 2, "-n", "2", "--", "sh", "-c", `echo "$UCPX_AUTH_KEY_FILE"; exec sleep 60`)
	key := strings.TrimSpace(lines[0][strings.Index(lines[0], "] ")+2:])
	require.True(t, strings.HasPrefix(filepath.Base(filepath.Dir(key)), "ucpx-launch-"), "%q", lines)
	require.FileExists(t, key)
	require.NoError(t, cmd.Process.Signal(syscall.SIGHUP))
	require.True(t, waitExit(t, cmd, 20*time.Second), "launch still runs after SIGHUP")
	_, err := os.Stat(filepath.Dir(key))
	assert.True(t, os.IsNotExist(err), "the job's key directory %s is left behind", filepath.Dir(key))
}

// A rank that ignores SIGINT and SIGTERM does not keep the launcher running: it is
// killed --grace after the signal was passed on, and at once on a second signal.
func TestLaunchKillsRanksThatIgnoreSignals(t *testing.T) {
	ignoring := []string{"--", "sh", "-c", `trap "" INT TERM HUP; echo ready; exec sleep 60`}
	cmd, _ := startLaunch(t, 2, append([]string{"-n", "2", "--grace", "500ms"}, ignoring...)...)
	start := time.Now()
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	require.True(t, waitExit(t, cmd, 20*time.Second), "launch still runs 20 s after SIGTERM with --grace 500ms")
	t.Logf("ended %v after SIGTERM", time.Since(start))

	cmd, _ = startLaunch(t, 2, append([]string{"-n", "2", "--grace", "1h"}, ignoring...)...)
	require.NoError(t, cmd.Process.Signal(syscall.SIGINT))
	time.Sleep(200 * time.Millisecond)
	require.NoError(t, cmd.Process.Signal(syscall.SIGINT))
	require.True(t, waitExit(t, cmd, 20*time.Second), "launch still runs 20 s after a second SIGINT")

	st, _, errs := run(t, "launch", "--grace", "-1s", "-n", "1", "--", "true")
	assert.Equal(t, 2, st)
	assert.Contains(t, errs, "--grace -1s: must not be negative")
}
