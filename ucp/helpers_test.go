package ucp

import (
	"context"
	"hash/crc32"
	"math/rand"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// pair is two workers in one process connected through a listener.
type pair struct {
	ctxA, ctxB *Context
	a, b       *Worker
	epA, epB   *Endpoint // epA: a->b (client), epB: b->a (accepted)
}

func newPair(t *testing.T, cfg map[string]string) *pair {
	t.Helper()
	p := &pair{}
	var err error
	p.ctxA, err = NewContext(ContextParams{Config: cfg})
	require.NoError(t, err)
	p.ctxB, err = NewContext(ContextParams{Config: cfg})
	require.NoError(t, err)
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
	close(connected)
	require.NoError(t, err)
	require.NoError(t, <-accepted)
	require.NoError(t, l.Close())
	t.Cleanup(func() { p.close(t) })
	return p
}

func (p *pair) close(t *testing.T) {
	t.Helper()
	require.NoError(t, p.ctxA.Close())
	require.NoError(t, p.ctxB.Close())
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
