package ucp

import (
	"context"
	"fmt"
	"hash/crc32"
	"math/rand"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// selfLoop is a worker connected to itself over shared memory.
func selfLoop(t *testing.T, wp WorkerParams) (*Context, *Worker, *Endpoint) {
	t.Helper()
	c, err := NewContext(ContextParams{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() }) // a test that fails early leaks nothing
	w, err := c.NewWorker(wp)
	require.NoError(t, err)
	addr, err := w.Address()
	require.NoError(t, err)
	ep, err := w.ConnectAddress(addr, &EndpointParams{NoPeerErrorHandling: true})
	require.NoError(t, err)
	return c, w, ep
}

// pair is two workers in one process connected through a listener.
type pair struct {
	ctxA, ctxB *Context
	a, b       *Worker
	epA, epB   *Endpoint // epA: a->b (client), epB: b->a (accepted)
}

func newPair(t *testing.T, cfg map[string]string) *pair {
	t.Helper()
	p, l, err := listenPair(t, ContextParams{Config: cfg}, ContextParams{Config: cfg})
	require.NoError(t, err)
	require.NoError(t, l.Close())
	return p
}

// listenPair connects a client context (params a) to a listening context (params b)
// through a listener; it returns the client's Connect error and the still-open listener.
func listenPair(t *testing.T, a, b ContextParams) (*pair, *Listener, error) {
	t.Helper()
	p := &pair{}
	var err error
	p.ctxA, err = NewContext(a)
	require.NoError(t, err)
	p.ctxB, err = NewContext(b)
	require.NoError(t, err)
	t.Cleanup(func() { p.close(t) })
	p.a, err = p.ctxA.NewWorker(WorkerParams{})
	require.NoError(t, err)
	p.b, err = p.ctxB.NewWorker(WorkerParams{})
	require.NoError(t, err)
	l, err := p.b.Listen("127.0.0.1:0", nil)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	accepted := make(chan error, 1)
	connected := make(chan struct{})
	go func() {
		var err error
		p.epB, err = l.Accept(ctx, nil)
		accepted <- err
		// The client's Connect completes only while the server makes progress.
		for {
			select {
			case <-connected:
				return
			default:
				p.b.Progress()
			}
		}
	}()
	p.epA, err = p.a.Connect(ctx, l.Addr(), nil)
	if err != nil {
		cancel()
		close(connected)
		<-accepted
		return p, l, err
	}
	close(connected)
	require.NoError(t, <-accepted)
	return p, l, nil
}

// newShmPair connects two workers by worker address without peer error handling,
// which is how UCX 1.13 selects shared-memory transports.
func newShmPair(t testing.TB) *pair {
	t.Helper()
	return shmPairWith(t, WorkerParams{})
}

// pairs runs f over tcp (listener, peer error handling) and shared memory.
func pairs(t *testing.T, f func(t *testing.T, p *pair)) {
	t.Run("tcp", func(t *testing.T) { f(t, newPair(t, map[string]string{"TLS": "tcp"})) })
	t.Run("shm", func(t *testing.T) { f(t, newShmPair(t)) })
}

func (p *pair) close(t testing.TB) {
	t.Helper()
	if p.ctxA != nil {
		require.NoError(t, p.ctxA.Close())
		p.ctxA = nil
	}
	if p.ctxB != nil {
		require.NoError(t, p.ctxB.Close())
		p.ctxB = nil
	}
}

// waitAll drives every request's worker until all are done or the timeout passes.
func waitAll(t *testing.T, timeout time.Duration, reqs ...*Request) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		all := true
		for _, r := range reqs {
			if done, _ := r.Test(); !done {
				all = false
			}
		}
		if all {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("requests not done after %v", timeout)
		}
	}
}

// wait drives both workers of the pair until every request is done. One-sided
// operations over tcp are emulated with active messages, so the target must progress too.
func (p *pair) wait(t *testing.T, reqs ...*Request) {
	t.Helper()
	progressAll(t, 30*time.Second, func() bool {
		for _, r := range reqs {
			if !r.Done() {
				return false
			}
		}
		return true
	}, p.a, p.b)
}

// background progresses w on its own goroutine until the returned stop is called.
func background(w *Worker) (stop func()) {
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		for {
			select {
			case <-done:
				return
			default:
				w.Progress()
			}
		}
	}()
	return func() { close(done); <-finished }
}

// progressAll drives workers until stop returns true or the timeout passes.
func progressAll(t *testing.T, timeout time.Duration, stop func() bool, ws ...*Worker) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !stop() {
		for _, w := range ws {
			w.Progress()
		}
		if time.Now().After(deadline) {
			t.Fatalf("condition not reached after %v", timeout)
		}
	}
}

func pattern(n int, seed int64) []byte {
	b := make([]byte, n)
	rand.New(rand.NewSource(seed)).Read(b)
	return b
}

func checksum(b []byte) uint32 { return crc32.ChecksumIEEE(b) }

func requireNoLeaks(t *testing.T) {
	t.Helper()
	require.True(t, Live().Zero(), "UCX handles left open: %+v", Live())
}

// echoTag answers rounds messages with tag in on w by sending each back on ep with tag
// out, with the fused calls (a receive buffer of size bytes).
func echoTag(ctx context.Context, w *Worker, ep *Endpoint, size int, in, out uint64, rounds int) error {
	buf := make([]byte, size)
	for i := 0; i < rounds; i++ {
		n, _, err := w.TagRecv(ctx, buf, in, ^uint64(0))
		if err == nil {
			err = ep.TagSend(ctx, buf[:n], out)
		}
		if err != nil {
			return fmt.Errorf("echo of tag %#x, round %d: %w", in, i, err)
		}
	}
	return nil
}

// untilClosed calls f over and over until stop is closed.
func untilClosed(stop <-chan struct{}, f func()) {
	for {
		select {
		case <-stop:
			return
		default:
			f()
		}
	}
}

// encodeControl is a control message of typ and value alone (tests).
func encodeControl(typ byte, value uint64) []byte {
	return encodeControlMsg(control{typ: typ, value: value})
}

// decodeControl opens a control message, its type and value (tests).
func decodeControl(s sealer, header []byte) (sender [idLen]byte, typ byte, value uint64, err error) {
	sender, msg, err := decodeControlMsg(s, header)
	return sender, msg.typ, msg.value, err
}
