package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/ucpx/ucpx/bootstrap"
	"github.com/ucpx/ucpx/trace"
	"github.com/ucpx/ucpx/ucp"
)

const launchSynopsis = `-n N [flags] -- command [args...]

Starts N ranks of command on this host, each with UCPX_RANK, UCPX_SIZE,
UCPX_RENDEZVOUS (rank 0 serves it), UCPX_LOCAL_RANK and, unless already set,
UCPX_AUTH_KEY_FILE (a fresh key for the job, removed afterwards). Output lines are
prefixed with the rank. When a rank fails the others are stopped (after --grace);
the status is the first failing rank's. SIGINT, SIGTERM and SIGHUP are passed on to
the ranks; those still running --grace later are killed, and at once on a second
signal. Across hosts, let the scheduler start one
process per rank with the same variables (see README: slurm, ssh).`

// runLaunch is `ucpx launch`.
func runLaunch(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("launch", launchSynopsis, stderr)
	n := fs.Int("n", 0, "number of ranks (1..4096)")
	rdv := fs.String("rendezvous", "", "host:port rank 0 serves the rendezvous on (default: a free loopback port)")
	grace := fs.Duration("grace", 5*time.Second, "how long the other ranks may run on after one failed, or the ranks after a signal was passed on to them, before they are killed")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	cmdline := fs.Args()
	if *n < 1 || *n > 4096 || len(cmdline) == 0 {
		fmt.Fprintf(stderr, "ucpx launch: need -n between 1 and 4096 and a command after --\n")
		fs.Usage()
		return 2
	}
	if path, ok := os.LookupEnv(trace.EnvFile); ok && path != "" && *n > 1 && !strings.Contains(path, "{pid}") {
		fmt.Fprintf(stderr, "ucpx launch: %s=%s names one file for %d ranks, which would write over each other's traces: put {pid} in it\n", trace.EnvFile, path, *n)
		return 2
	}
	if *grace < 0 {
		fmt.Fprintf(stderr, "ucpx launch: --grace %v: must not be negative\n", *grace)
		return 2
	}
	if *rdv == "" {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			fmt.Fprintf(stderr, "ucpx launch: pick a rendezvous port: %v\n", err)
			return 1
		}
		*rdv = ln.Addr().String()
		_ = ln.Close()
	}
	// From before the key exists until the ranks are gone, INT, TERM and HUP (a closed
	// terminal) are the launcher's to pass on: it must outlive its ranks to remove the
	// job's key. One that comes while the ranks start is passed on once they have.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)
	env := append(os.Environ(), bootstrap.EnvSize+"="+strconv.Itoa(*n), bootstrap.EnvRendezvous+"="+*rdv,
		"UCPX_LOCAL_SIZE="+strconv.Itoa(*n))
	if os.Getenv(bootstrap.EnvAuthKeyFile) == "" {
		dir, err := os.MkdirTemp("", "ucpx-launch-")
		if err != nil {
			fmt.Fprintf(stderr, "ucpx launch: %v\n", err)
			return 1
		}
		defer os.RemoveAll(dir)
		keyFile := filepath.Join(dir, "key")
		if err := ucp.WriteAuthKeyFile(keyFile, bootstrap.NewKey()); err != nil {
			fmt.Fprintf(stderr, "ucpx launch: %v\n", err)
			return 1
		}
		env = append(env, bootstrap.EnvAuthKeyFile+"="+keyFile)
	}

	type rank struct {
		cmd  *exec.Cmd
		out  *prefixWriter
		err  error
		done chan struct{}
	}
	ranks := make([]*rank, *n)
	failed := make(chan int, *n)
	var outMu sync.Mutex
	lockedOut := writerFunc(func(b []byte) (int, error) { outMu.Lock(); defer outMu.Unlock(); return stdout.Write(b) })
	for r := range ranks {
		cmd := exec.Command(cmdline[0], cmdline[1:]...)
		cmd.Env = append(env, bootstrap.EnvRank+"="+strconv.Itoa(r), "UCPX_LOCAL_RANK="+strconv.Itoa(r))
		pw := &prefixWriter{w: lockedOut, prefix: fmt.Sprintf("[%d] ", r)}
		cmd.Stdout, cmd.Stderr = pw, pw
		cmd.WaitDelay = 2 * time.Second
		// A rank dies with the launcher instead of spinning on alone.
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		rk := &rank{cmd: cmd, out: pw, done: make(chan struct{})}
		ranks[r] = rk
		if err := cmd.Start(); err != nil {
			fmt.Fprintf(stderr, "ucpx launch: start rank %d: %v\n", r, err)
			for _, o := range ranks[:r] {
				_ = o.cmd.Process.Kill()
				<-o.done
			}
			return 1
		}
		go func() {
			rk.err = cmd.Wait()
			pw.flush()
			close(rk.done)
			if rk.err != nil {
				failed <- r
			}
		}()
	}
	all := make(chan struct{})
	go func() {
		for _, rk := range ranks {
			<-rk.done
		}
		close(all)
	}()
	first := -1
	stop := func(sig os.Signal) {
		for _, rk := range ranks {
			select {
			case <-rk.done:
			default:
				_ = rk.cmd.Process.Signal(sig)
			}
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	killAfter := func(d time.Duration) {
		go func() {
			select {
			case <-time.After(d):
				stop(syscall.SIGKILL)
			case <-ctx.Done():
			}
		}()
	}
	signalled := false
	for waiting := true; waiting; {
		select {
		case <-all:
			waiting = false
		case r := <-failed:
			if first < 0 {
				first = r
				fmt.Fprintf(stderr, "ucpx launch: rank %d failed (%v); stopping the others in %v\n", r, ranks[r].err, *grace)
				killAfter(*grace)
			}
		case s := <-sigs:
			if signalled { // a rank that ignores the first must not hold the launcher
				fmt.Fprintf(stderr, "ucpx launch: %v again: killing the ranks\n", s)
				stop(syscall.SIGKILL)
				continue
			}
			signalled = true
			fmt.Fprintf(stderr, "ucpx launch: %v: passed on to the ranks; those still running in %v are killed\n", s, *grace)
			stop(s)
			killAfter(*grace)
		}
	}
	if first < 0 {
		for r, rk := range ranks {
			if rk.err != nil {
				first = r
				break
			}
		}
	}
	if first < 0 {
		return 0
	}
	var ee *exec.ExitError
	if errors.As(ranks[first].err, &ee) && ee.ExitCode() > 0 {
		return ee.ExitCode()
	}
	return 1
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }
