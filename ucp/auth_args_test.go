package ucp

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Every unchecked argument of the point 4 gives a clear error at the call, and
// a panicking callback does not take the process down.
func TestBadArgumentsAtTheTrustBoundary(t *testing.T) {
	pairs(t, func(t *testing.T, p *pair) {
		// RequestParam.Peer naming an endpoint of another worker.
		_, err := p.a.TagRecvNbx(make([]byte, 8), 1, ^uint64(0), &RequestParam{Peer: p.epB})
		require.ErrorIs(t, err, ErrInvalidParam)

		// An AM header over UCX's max_am_header.
		max := p.a.maxAmHeader
		require.Positive(t, max)
		_, err = p.epA.AmSendNbx(3, make([]byte, max+1), nil, nil)
		require.ErrorIs(t, err, ErrInvalidParam)
		_, err = p.epA.AmSendNbx(RevokeAM, nil, nil, nil)
		require.ErrorIs(t, err, ErrInvalidParam)
		require.ErrorIs(t, p.a.SetAmHandler(RevokeAM, func(*AmMessage) {}), ErrInvalidParam)

		// A header at the limit goes through.
		got := make(chan int, 1)
		require.NoError(t, p.b.SetAmHandler(3, func(m *AmMessage) { got <- len(m.Header) }))
		r, err := p.epA.AmSendNbx(3, bytes.Repeat([]byte{1}, max), nil, nil)
		require.NoError(t, err)
		p.wait(t, r)
		progressAll(t, 20*time.Second, func() bool { return len(got) == 1 }, p.a, p.b)
		require.Equal(t, max, <-got)

		// MemH.Bytes after Close.
		m, err := p.ctxA.MemAlloc(64)
		require.NoError(t, err)
		require.Len(t, m.Bytes(), 64)
		require.NoError(t, m.Close())
		require.Nil(t, m.Bytes())
	})
}

// CloseNbx(true) on an endpoint without peer error handling (shared memory) fails
// before changing anything: the endpoint stays open, counted, and usable.
func TestForceCloseWithoutPeerErrorHandling(t *testing.T) {
	p := newShmPair(t)
	before := Live().Endpoints
	_, err := p.epA.CloseNbx(true)
	require.ErrorIs(t, err, ErrInvalidParam)
	require.Equal(t, before, Live().Endpoints)
	msg := pattern(64, 9)
	s, err := p.epA.TagSendNbx(msg, 5, nil)
	require.NoError(t, err)
	buf := make([]byte, 64)
	r, err := p.b.TagRecvNbx(buf, 5, ^uint64(0), nil)
	require.NoError(t, err)
	p.wait(t, s, r)
	require.Equal(t, msg, buf)
	stop := background(p.b)
	require.NoError(t, p.epA.Close())
	stop()
	require.Equal(t, before-1, Live().Endpoints)
}

// A panicking AM handler or Request callback is recovered: the process survives, the
// panic is reported, and the worker keeps working.
func TestPanickingCallbacksAreRecovered(t *testing.T) {
	p := newShmPair(t)
	RecoveredPanics()
	require.NoError(t, p.b.SetAmHandler(4, func(*AmMessage) { panic("handler boom") }))
	r, err := p.epA.AmSendNbx(4, []byte("h"), []byte("data"), nil)
	require.NoError(t, err)
	p.wait(t, r)
	var got []error
	progressAll(t, 20*time.Second, func() bool { got = append(got, RecoveredPanics()...); return len(got) > 0 }, p.a, p.b)
	require.ErrorIs(t, got[0], ErrPanic)
	require.Contains(t, got[0].Error(), "handler boom")

	cbRan := make(chan struct{})
	r, err = p.b.TagRecvNbx(make([]byte, 8), 9, ^uint64(0), &RequestParam{Callback: func(*Request) {
		close(cbRan)
		panic("callback boom")
	}})
	require.NoError(t, err)
	s, err := p.epA.TagSendNbx([]byte("12345678"), 9, nil)
	require.NoError(t, err)
	p.wait(t, s, r)
	progressAll(t, 20*time.Second, func() bool {
		select {
		case <-cbRan:
			return true
		default:
			return false
		}
	}, p.a, p.b)
	require.NoError(t, r.Err())
	got = RecoveredPanics()
	require.Len(t, got, 1)
	require.Contains(t, got[0].Error(), "callback boom")
	// Still working.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err = p.epA.TagSendNbx([]byte("after"), 10, nil)
	require.NoError(t, err)
	buf := make([]byte, 5)
	r, err = p.b.TagRecvNbx(buf, 10, ^uint64(0), nil)
	require.NoError(t, err)
	p.wait(t, s, r)
	require.NoError(t, r.Wait(ctx))
	require.Equal(t, "after", string(buf))
}
