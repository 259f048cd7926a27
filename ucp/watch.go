package ucp

import (
	"bytes"
	"errors"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/ucpx/ucpx/cgo/ucx"
)

// Same-host peers are watched through a pidfd: UCX 1.13 notices nothing when a peer
// behind shared memory dies, so without this a receive from it (and the stream that
// waits on that receive) would wait forever. The peer's pid and boot id come from the
// authenticated handshake or the sealed worker address; a pid is only trusted on the
// same boot. The pidfd sits in Go's netpoller, so a death is seen at once (no polling).

type pidWatch struct {
	f   *os.File
	rc  syscall.RawConn
	pid int
}

func (p *pidWatch) stop() { _ = p.f.Close() }

// exited reports whether the peer process has exited or is exiting, without waiting
// for the watching goroutine to notice. A pidfd turns readable only at the end of the
// exit, after the process's memory (its shared-memory segments with it) is gone, so
// the kernel's exiting flag of the process is read too: it is set as the exit begins.
func (p *pidWatch) exited() bool {
	gone := false
	_ = p.rc.Control(func(fd uintptr) { gone = readable(fd) })
	if gone {
		return true
	}
	// Not exited: the pid is still the peer's (the pidfd pins it), so its stat is.
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(p.pid) + "/stat")
	return err == nil && statExiting(stat)
}

// pfExiting is the kernel's PF_EXITING task flag.
const pfExiting = 0x4

// statExiting reports whether a /proc/PID/stat line is of a process that is exiting
// (PF_EXITING in its flags) or gone (state Z or X). The command name, in parentheses,
// may itself hold spaces and parentheses: the fields are counted from the last ')'.
func statExiting(stat []byte) bool {
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return false
	}
	// After the name: state ppid pgrp session tty_nr tpgid flags ...
	f := strings.Fields(string(stat[i+1:]))
	if len(f) < 7 {
		return false
	}
	if f[0] == "Z" || f[0] == "X" || f[0] == "x" {
		return true
	}
	flags, err := strconv.ParseUint(f[6], 10, 64)
	return err == nil && flags&pfExiting != 0
}

// startWatch watches the endpoint's peer process if it runs on this machine.
func (ep *Endpoint) startWatch() {
	t := ep.w.ctx.trust
	if !ep.peerKnown || ep.peer.pid == 0 || ep.peer.pid == t.pid || ep.peer.boot == ([idLen]byte{}) || ep.peer.boot != t.boot {
		return
	}
	fd, err := unix.PidfdOpen(int(ep.peer.pid), unix.PIDFD_NONBLOCK)
	if errors.Is(err, unix.ESRCH) {
		ep.peerDied() // gone already
		return
	}
	if err != nil {
		return // no pidfd (kernel before 5.3, or seccomp): UCX's own detection only
	}
	f := os.NewFile(uintptr(fd), "pidfd")
	rc, err := f.SyscallConn()
	if err != nil {
		_ = f.Close()
		return
	}
	pw := &pidWatch{f: f, rc: rc, pid: int(ep.peer.pid)}
	w := ep.w
	w.mu.Lock()
	if ep.closed || ep.err != nil || w.closed.Load() {
		w.mu.Unlock()
		_ = f.Close()
		return
	}
	ep.watch = pw
	w.mu.Unlock()
	go func() {
		// A pidfd is readable once the process exited.
		err := rc.Read(readable)
		if err == nil {
			ep.peerDied()
		}
		_ = f.Close()
	}()
}

// orphanRecvsLocked fails what is still pending on a failed endpoint without peer
// error handling, which UCX can neither cancel nor force-close: each receive naming it
// completes with ep.err, its UCX request left to complete into a stand-in (or to the
// worker's destruction). It reports whether the endpoint is such a one.
func (ep *Endpoint) orphanRecvsLocked() bool {
	if !ep.params.NoPeerErrorHandling {
		return false
	}
	for r := range ep.recvs {
		if r.req != nil {
			ep.w.orphanLocked(r, ep.err)
		}
	}
	return true
}

// peerDied fails the endpoint as UCX does for a peer it saw fail: receives naming it
// complete with the error, its handlers run, later operations on it fail.
func (ep *Endpoint) peerDied() {
	w := ep.w
	w.mu.Lock()
	if ep.closed || ep.err != nil || w.closed.Load() {
		w.mu.Unlock()
		return
	}
	ep.failLocked(Status(ucx.ErrConnectionReset))
	// The canceled receives complete on the next progress: do it here, so nobody has to.
	w.progressLocked(nil, 1)
	if ep.orphanRecvsLocked() {
		w.afterLocked() // wake whoever is parked on them
	}
	w.unlockDeferred()
	_ = w.Signal()
}

// sent records a pending operation on ep when nothing else would fail it if the peer
// dies: an endpoint without peer error handling whose peer is watched. peerDied fails
// what is still pending then. Elsewhere it costs a few tests.
func (ep *Endpoint) sent(r *Request, err error) (*Request, error) {
	if err == nil && ep.watch != nil && ep.params.NoPeerErrorHandling && r != completedRequest && r.peer == nil && !r.done.Load() {
		r.peer = ep
		ep.recvs[r] = struct{}{}
	}
	return r, err
}

// orphanLocked completes pending r with err although UCX still holds its request: a
// stand-in takes r's slot, so UCX's eventual completion (or the worker's destruction)
// finds the stand-in, not r or whatever reuses it.
func (w *Worker) orphanLocked(r *Request, err error) {
	stand := &Request{w: w, op: r.op + " (orphaned)", req: r.req, slot: r.slot, notify: r.notify}
	// The buffer stays pinned with the stand-in (the pin moves to it): UCX may still
	// write into it (a rendezvous under way), and the collector must not reuse it.
	stand.pin, stand.pinned = r.pin, r.pinned
	r.pin, r.pinned = runtime.Pinner{}, false
	w.pending[r.slot] = stand
	if w.orphans == nil {
		w.orphans = map[*Request]bool{}
	}
	w.orphans[stand] = true
	r.req = nil
	r.completeLocked(err, 0, 0)
}
