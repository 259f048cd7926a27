package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// boundedRun is the outcome of runBounded.
type boundedRun struct {
	status   int // exit status; -1 when killed
	out, err string
	killed   string // why the test killed it ("" when it exited on its own)
}

// maxChildRSS bounds the resident memory of a command runBounded starts, with its own
// children: far above what a refused call or a small run needs, far below what would
// hurt a shared machine.
const maxChildRSS = 1 << 30

// runBounded runs this test binary as `ucpx args...` (with env added) in a process
// group of its own, and kills the group when it runs past timeout or its processes
// together hold more than maxChildRSS: a regression to an endless loop or an
// allocation the size of a flag's value fails the test instead of the machine.
func runBounded(t *testing.T, timeout time.Duration, env []string, args ...string) boundedRun {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(append(os.Environ(), reexecEnv+"=1"), env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %v: %v", args, err)
	}
	pgid := cmd.Process.Pid
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	var res boundedRun
	var err error
wait:
	for {
		select {
		case err = <-done:
			break wait
		case <-ctx.Done():
			res.killed = "ran past " + timeout.String()
		case <-tick.C:
			if rss := groupRSS(pgid); rss > maxChildRSS {
				res.killed = "held " + strconv.FormatInt(rss>>20, 10) + " MiB"
			}
		}
		if res.killed != "" {
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
			err = <-done
			break
		}
	}
	_ = syscall.Kill(-pgid, syscall.SIGKILL) // a peer left behind
	res.out, res.err = out.String(), errb.String()
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		res.status = ee.ExitCode()
	default:
		t.Fatalf("%v: %v", args, err)
	}
	return res
}

// groupRSS is the resident memory of process group pgid's processes, in bytes.
func groupRSS(pgid int) int64 {
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	var sum int64
	for _, p := range stats {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		// pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt
		// cmajflt utime stime cutime cstime priority nice threads itrealvalue
		// starttime vsize rss: fields after the comm's closing parenthesis.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) < 22 {
			continue
		}
		if g, _ := strconv.Atoi(f[2]); g != pgid {
			continue
		}
		pages, _ := strconv.ParseInt(f[21], 10, 64)
		sum += pages * int64(os.Getpagesize())
	}
	return sum
}
