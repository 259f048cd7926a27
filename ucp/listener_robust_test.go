package ucp

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// keyedListener is a listening worker and a client worker of two contexts that share
// an auth key; the listener is closed and the contexts too at the end of the test.
func keyedListener(t *testing.T) (client *Worker, l *Listener) {
	t.Helper()
	key, err := GenerateAuthKey()
	require.NoError(t, err)
	ctxs := make([]*Context, 2)
	ws := make([]*Worker, 2)
	for i := range ctxs {
		ctxs[i], err = NewContext(ContextParams{AuthKey: key})
		require.NoError(t, err)
		c := ctxs[i]
		t.Cleanup(func() { _ = c.Close() })
		ws[i], err = c.NewWorker(WorkerParams{})
		require.NoError(t, err)
	}
	l, err = ws[1].Listen("127.0.0.1:0", nil)
	require.NoError(t, err)
	return ws[0], l
}

// connectAccept connects client to l while another goroutine accepts (and then
// progresses the server until the client is done): both endpoints, or Connect's error.
func connectAccept(t *testing.T, client *Worker, l *Listener, timeout time.Duration) (cep, sep *Endpoint, err error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	accepted := make(chan *Endpoint, 1)
	connected := make(chan struct{})
	go func() {
		ep, _ := l.Accept(ctx, nil)
		accepted <- ep
		if ep != nil {
			untilClosed(connected, func() { l.w.Progress() })
		}
	}()
	cep, err = client.Connect(ctx, l.Addr(), nil)
	close(connected)
	cancel() // an Accept still waiting returns
	sep = <-accepted
	return cep, sep, err
}

// One failed accept(2) (the process at its descriptor limit: EMFILE) ended the
// listener's serving for good: clients that came after the limit was lifted waited
// for an answer that never came. Now the listener pauses and accepts again.
func TestListenerServesAfterAcceptFails(t *testing.T) {
	client, l := keyedListener(t)
	var lim unix.Rlimit
	require.NoError(t, unix.Getrlimit(unix.RLIMIT_NOFILE, &lim))
	ents, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	low := lim
	low.Cur = uint64(len(ents) + 4) // the client's dials take what is left
	require.NoError(t, unix.Setrlimit(unix.RLIMIT_NOFILE, &low))
	restored := false
	restore := func() {
		if !restored {
			restored = true
			require.NoError(t, unix.Setrlimit(unix.RLIMIT_NOFILE, &lim))
		}
	}
	defer restore()
	var conns []net.Conn
	for range 16 {
		c, err := net.Dial("tcp", l.Addr())
		if err != nil {
			break
		}
		conns = append(conns, c)
	}
	time.Sleep(100 * time.Millisecond) // the listener's accept meets EMFILE
	for _, c := range conns {
		_ = c.Close()
	}
	restore()
	require.NotEmpty(t, conns)

	cep, sep, err := connectAccept(t, client, l, 5*time.Second)
	require.NoError(t, err, "the listener stopped serving after a failed accept")
	require.NotNil(t, sep)
	_ = cep
	require.NoError(t, l.Close())
}

// maxHandshakes idle connections (no key, not a byte sent) took every handshake slot
// for the 10 s of a handshake, and the key's holders were refused meanwhile. Now a new
// connection evicts the oldest one still waiting for its hello.
func TestListenerIdleConnectionsDoNotLockOutClients(t *testing.T) {
	client, l := keyedListener(t)
	var idle []net.Conn
	defer func() {
		for _, c := range idle {
			_ = c.Close()
		}
	}()
	for range maxHandshakes {
		c, err := net.Dial("tcp", l.Addr())
		require.NoError(t, err)
		idle = append(idle, c)
	}
	// Every one of them holds a slot (within helloTimeout of its accept).
	require.Eventually(t, func() bool {
		l.cmu.Lock()
		defer l.cmu.Unlock()
		return len(l.shaking) == maxHandshakes
	}, helloTimeout/2, time.Millisecond)
	_, sep, err := connectAccept(t, client, l, helloTimeout/2)
	require.NoError(t, err, "a client holding the key was locked out by %d idle connections", maxHandshakes)
	require.NotNil(t, sep)
	require.NoError(t, l.Close())
}

// A connection that sends nothing is dropped once helloTimeout passed, not after the
// whole handshake's 10 s.
func TestListenerDropsConnectionWithoutHello(t *testing.T) {
	_, l := keyedListener(t)
	c, err := net.Dial("tcp", l.Addr())
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.SetDeadline(time.Now().Add(handshakeTimeout/2)))
	hello := make([]byte, hsServerHello)
	_, err = io.ReadFull(c, hello)
	require.NoError(t, err)
	_, err = c.Read(make([]byte, 1))
	require.Error(t, err)
	var ne net.Error
	require.False(t, errors.As(err, &ne) && ne.Timeout(), "still open after %v", handshakeTimeout/2)
	require.NoError(t, l.Close())
}

// A connection past its hello is never evicted: when every slot holds one, the new
// connection is refused; otherwise the oldest connection still waiting goes.
func TestListenerEvictsOnlyConnectionsWaitingForHello(t *testing.T) {
	l := &Listener{conns: map[net.Conn]struct{}{}, shaking: map[*hsConn]struct{}{}}
	t0 := time.Now()
	var pipes []net.Conn
	defer func() {
		for _, c := range pipes {
			_ = c.Close()
		}
	}()
	add := func(i int, hello bool) *hsConn {
		a, b := net.Pipe()
		pipes = append(pipes, a, b)
		c := &hsConn{Conn: a, l: l, since: t0.Add(time.Duration(i) * time.Millisecond), hello: hello}
		l.shaking[c] = struct{}{}
		l.conns[c] = struct{}{}
		return c
	}
	for i := range maxHandshakes {
		add(i, true)
	}
	l.cmu.Lock()
	require.False(t, l.evictLocked(), "a connection past its hello was evicted")
	l.cmu.Unlock()
	require.Len(t, l.shaking, maxHandshakes)

	newer := add(maxHandshakes+2, false)
	older := add(maxHandshakes+1, false)
	l.cmu.Lock()
	require.True(t, l.evictLocked())
	l.cmu.Unlock()
	require.True(t, older.evicted)
	require.False(t, newer.evicted)
	require.NotContains(t, l.shaking, older)
	require.NotContains(t, l.conns, net.Conn(older))
	_, err := older.Read(make([]byte, 1))
	require.Error(t, err, "the evicted connection is closed")
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime(t *testing.T) time.Duration {
	var ru unix.Rusage
	require.NoError(t, unix.Getrusage(unix.RUSAGE_SELF, &ru))
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// An idle Accept polled the worker every millisecond (about 6 % of a core, much more
// under the race detector). Now it parks on the worker's event fd as Request.Wait does.
// The bound is generous (a loaded machine, the race detector): polling measured 50-100
// ms per second, parked about 2.
func TestListenerIdleAcceptParks(t *testing.T) {
	c, err := NewContext(ContextParams{})
	require.NoError(t, err)
	defer c.Close()
	w, err := c.NewWorker(WorkerParams{})
	require.NoError(t, err)
	l, err := w.Listen("127.0.0.1:0", nil)
	require.NoError(t, err)
	const idle = 1500 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), idle)
	defer cancel()
	before := cpuTime(t)
	start := time.Now()
	_, err = l.Accept(ctx, nil)
	used, took := cpuTime(t)-before, time.Since(start)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	perSecond := time.Duration(float64(used) / took.Seconds())
	t.Logf("idle Accept: %v CPU over %v (%v per second)", used, took, perSecond)
	require.Less(t, perSecond, 20*time.Millisecond, "an idle Accept keeps the CPU busy")

	// It still wakes for what it waits for: a listener's Close.
	res := make(chan error, 1)
	go func() {
		_, err := l.Accept(context.Background(), nil)
		res <- err
	}()
	time.Sleep(20 * time.Millisecond)
	require.NoError(t, l.Close())
	select {
	case err := <-res:
		require.ErrorIs(t, err, ErrClosed)
	case <-time.After(5 * time.Second):
		t.Fatal("Accept still parked after the listener closed")
	}
}
