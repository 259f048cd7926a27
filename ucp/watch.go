package ucp

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"

	"github.com/ucpx/ucpx/cgo/ucx"
)

// Same-host peers are watched through a pidfd: UCX 1.13 notices nothing when a peer
// behind shared memory dies, so without this a receive from it (and the stream that
// waits on that receive) would wait forever. The peer's pid and boot id come from the
// authenticated handshake or the sealed worker address; a pid is only trusted on the
// same boot. The pidfd sits in Go's netpoller, so a death is seen at once (no polling).

type pidWatch struct {
	f *os.File
}

func (p *pidWatch) stop() { _ = p.f.Close() }

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
	pw := &pidWatch{f: f}
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
		err := rc.Read(func(fd uintptr) bool {
			// A pidfd is readable once the process exited.
			pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
			n, _ := unix.Poll(pfd, 0)
			return n > 0
		})
		if err == nil {
			ep.peerDied()
		}
		_ = f.Close()
	}()
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
	cbs := w.takeDeferredLocked()
	w.mu.Unlock()
	runDeferred(cbs)
	_ = w.Signal()
}
