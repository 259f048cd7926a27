package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"

	"github.com/ucpx/ucpx/trace"
)

// peerProc is a peer process: this binary re-executed with a hidden subcommand.
//
// The peer's stdin is a pipe the parent never writes to: when the parent dies, the
// pipe closes and the peer's watchdog (watchParent) ends it, so no orphan keeps
// spinning. Its stdout and stderr are copied to the parent's stderr with a prefix.
type peerProc struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	done  chan struct{}
	err   error // cmd.Wait's result, valid after done is closed
}

// startPeer starts `<this binary> args...` as a peer process.
func startPeer(args []string, logw io.Writer, prefix string) (*peerProc, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("find own executable to start the peer: %w", err)
	}
	cmd := exec.Command(exe, args...)
	cmd.Env = append(peerEnviron(), reexecEnv+"=1")
	out := &prefixWriter{w: logw, prefix: prefix}
	cmd.Stdout = out
	cmd.Stderr = out
	// Bounds Wait if a grandchild kept the output pipes open.
	cmd.WaitDelay = 2 * time.Second
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, fmt.Errorf("peer stdin pipe: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start peer %s: %w", exe, err)
	}
	p := &peerProc{cmd: cmd, stdin: stdin, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		out.flush()
		close(p.done)
	}()
	return p, nil
}

// peerEnviron is this process's environment for a peer, less a UCPX_TRACE that names
// one file for every process (no "{pid}" in it): the peer would write over this
// process's trace. With "{pid}", each process writes its own file.
func peerEnviron() []string {
	env := os.Environ()
	if path, ok := os.LookupEnv(trace.EnvFile); !ok || strings.Contains(path, "{pid}") {
		return env
	}
	kept := env[:0]
	for _, kv := range env {
		if !strings.HasPrefix(kv, trace.EnvFile+"=") {
			kept = append(kept, kv)
		}
	}
	return kept
}

// exited reports whether the peer has exited, and how.
func (p *peerProc) exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.err
	default:
		return false, nil
	}
}

// wait waits up to timeout for the peer to exit on its own, then kills it. It always
// reaps the process. It returns the exit error (nil for status 0).
func (p *peerProc) wait(timeout time.Duration) error {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-p.done:
		_ = p.stdin.Close()
		return p.err
	case <-t.C:
	}
	_ = p.stdin.Close()
	_ = p.cmd.Process.Kill()
	<-p.done
	return fmt.Errorf("peer did not exit within %v and was killed (%v)", timeout, p.err)
}

// kill ends the peer at once and reaps it.
func (p *peerProc) kill() {
	_ = p.stdin.Close()
	_ = p.cmd.Process.Kill()
	<-p.done
}

// watchParent ends this (peer) process when its stdin closes, i.e. when the parent
// that started it went away. Only peers started by startPeer call it.
func watchParent(what string) {
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		fmt.Fprintf(os.Stderr, "%s: parent process went away (stdin closed), exiting\n", what)
		os.Exit(3)
	}()
}

// prefixWriter writes whole lines, each preceded by prefix. A line longer than
// maxPrefixedLine is written in pieces of that size (each prefixed), so a child that
// writes without newlines costs bounded memory, and each byte is scanned once.
type prefixWriter struct {
	mu     sync.Mutex
	w      io.Writer
	prefix string
	buf    []byte
}

const maxPrefixedLine = 64 << 10

func (pw *prefixWriter) Write(b []byte) (int, error) {
	pw.mu.Lock()
	defer pw.mu.Unlock()
	n := len(b)
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			room := maxPrefixedLine - len(pw.buf)
			if len(b) < room {
				pw.buf = append(pw.buf, b...)
				break
			}
			pw.buf = append(pw.buf, b[:room]...)
			b = b[room:]
			fmt.Fprintf(pw.w, "%s%s\n", pw.prefix, pw.buf)
			pw.buf = pw.buf[:0]
			continue
		}
		fmt.Fprintf(pw.w, "%s%s%s\n", pw.prefix, pw.buf, b[:i])
		pw.buf = pw.buf[:0]
		b = b[i+1:]
	}
	return n, nil
}

func (pw *prefixWriter) flush() {
	pw.mu.Lock()
	defer pw.mu.Unlock()
	if len(pw.buf) > 0 {
		fmt.Fprintf(pw.w, "%s%s\n", pw.prefix, pw.buf)
		pw.buf = nil
	}
}

// ctlConn is the out-of-band control channel of `ucpx perf`: JSON messages, one per
// line, over a loopback TCP connection. Every read and write is bounded by a deadline.
type ctlConn struct {
	conn net.Conn
	r    *bufio.Reader
	enc  *json.Encoder
}

func newCtlConn(c net.Conn) *ctlConn {
	return &ctlConn{conn: c, r: bufio.NewReader(c), enc: json.NewEncoder(c)}
}

func (c *ctlConn) send(v any, timeout time.Duration) error {
	_ = c.conn.SetWriteDeadline(time.Now().Add(timeout))
	if err := c.enc.Encode(v); err != nil {
		return fmt.Errorf("control channel send: %w", err)
	}
	return nil
}

// recv reads one message into v, waiting at most timeout (or until ctx ends).
func (c *ctlConn) recv(ctx context.Context, v any, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	wait := time.Until(deadline).Round(time.Millisecond)
	_ = c.conn.SetReadDeadline(deadline)
	line, err := c.r.ReadBytes('\n')
	if err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return fmt.Errorf("control channel: no message from the peer within %v", wait)
		}
		if errors.Is(err, io.EOF) {
			return errors.New("control channel: the peer closed the connection")
		}
		return fmt.Errorf("control channel receive: %w", err)
	}
	if err := json.Unmarshal(line, v); err != nil {
		return fmt.Errorf("control channel: bad message %q: %w", bytes.TrimSpace(line), err)
	}
	return nil
}

func (c *ctlConn) close() { _ = c.conn.Close() }
