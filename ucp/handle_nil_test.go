package ucp

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/internal/testenv"
	"github.com/ucpx/ucpx/protocol"
	"github.com/ucpx/ucpx/stream"
)

// The handle a failed call returns is nil: its methods report that instead of crashing.

func TestNilContext(t *testing.T) {
	var c *Context
	require.False(t, c.Authenticated())
	require.ErrorIs(t, c.Close(), ErrInvalidParam)
	require.Nil(t, c.Device())
	require.Zero(t, c.Features())
	require.Equal(t, protocol.HostIdentity{}, c.HostIdentity())
	m, err := c.MemAlloc(64)
	require.Nil(t, m)
	require.ErrorIs(t, err, ErrInvalidParam)
	m, err = c.MemMap(make([]byte, 64))
	require.Nil(t, m)
	require.ErrorIs(t, err, ErrInvalidParam)
	m, err = c.MemMapPtr(1, 64, MemoryHost)
	require.Nil(t, m)
	require.ErrorIs(t, err, ErrInvalidParam)
	require.Nil(t, c.MemoryTypes())
	w, err := c.NewWorker(WorkerParams{})
	require.Nil(t, w)
	require.ErrorIs(t, err, ErrInvalidParam)
	c.Print()
	require.False(t, c.SupportsMemoryType(MemoryHost))
}

func TestNilWorker(t *testing.T) {
	var w *Worker
	ctx := context.Background()
	addr, err := w.Address()
	require.Nil(t, addr)
	require.ErrorIs(t, err, ErrInvalidParam)
	require.ErrorIs(t, w.Arm(), ErrInvalidParam)
	require.ErrorIs(t, w.Close(), ErrInvalidParam)
	ep, err := w.Connect(ctx, "127.0.0.1:1", nil)
	require.Nil(t, ep)
	require.ErrorIs(t, err, ErrInvalidParam)
	ep, err = w.ConnectAddress([]byte{1}, nil)
	require.Nil(t, ep)
	require.ErrorIs(t, err, ErrInvalidParam)
	require.Nil(t, w.Context())
	fd, err := w.EventFD()
	require.Equal(t, -1, fd)
	require.ErrorIs(t, err, ErrInvalidParam)
	require.ErrorIs(t, w.Fence(), ErrInvalidParam)
	r, err := w.FlushNbx(nil)
	require.Nil(t, r)
	require.ErrorIs(t, err, ErrInvalidParam)
	l, err := w.Listen("127.0.0.1:0", nil)
	require.Nil(t, l)
	require.ErrorIs(t, err, ErrInvalidParam)
	s, err := w.NewSignals(nil, 1)
	require.Nil(t, s)
	require.ErrorIs(t, err, ErrInvalidParam)
	require.Zero(t, w.Progress())
	require.ErrorIs(t, w.SetAmHandler(1, nil), ErrInvalidParam)
	require.ErrorIs(t, w.Signal(), ErrInvalidParam)
	require.Equal(t, StagingStats{}, w.StagingStats())
	n, tag, err := w.TagRecv(ctx, make([]byte, 8), 1, ^uint64(0))
	require.Zero(t, n)
	require.Zero(t, tag)
	require.ErrorIs(t, err, ErrInvalidParam)
	r, err = w.TagRecvNbx(make([]byte, 8), 1, ^uint64(0), nil)
	require.Nil(t, r)
	require.ErrorIs(t, err, ErrInvalidParam)
	require.ErrorIs(t, w.Trace(nil), ErrInvalidParam)
	require.ErrorIs(t, w.WaitForEvents(ctx, time.Millisecond), ErrInvalidParam)
}

func TestNilEndpoint(t *testing.T) {
	var ep *Endpoint
	ctx := context.Background()
	buf := make([]byte, 8)
	requireNilReq := func(r *Request, err error) {
		t.Helper()
		require.Nil(t, r)
		require.ErrorIs(t, err, ErrInvalidParam)
	}
	requireNilReq(ep.AmSendNbx(1, nil, buf, nil))
	requireNilReq(ep.AtomicNbx(AtomicParam{Op: AtomicAdd, Operand: 1}, 0, nil, nil))
	require.ErrorIs(t, ep.Close(), ErrInvalidParam)
	requireNilReq(ep.CloseNbx(true))
	require.ErrorIs(t, ep.Err(), ErrInvalidParam)
	requireNilReq(ep.FlushNbx(nil))
	requireNilReq(ep.GetNbx(buf, 0, nil, nil))
	ep.OnFailure(func(*Endpoint, error) { t.Error("OnFailure ran on a nil endpoint") })
	requireNilReq(ep.PutNbx(buf, 0, nil, nil))
	requireNilReq(ep.PutSignalNbx(buf, 0, nil, Signal{}, nil))
	require.Equal(t, protocol.ReachNone, ep.Reach(nil))
	require.Equal(t, "ep(<nil>)", ep.String())
	require.ErrorIs(t, ep.TagSend(ctx, buf, 1), ErrInvalidParam)
	requireNilReq(ep.TagSendNbx(buf, 1, nil))
	n, tag, err := ep.TagSendRecv(ctx, buf, 1, buf, 2, ^uint64(0))
	require.Zero(t, n)
	require.Zero(t, tag)
	require.ErrorIs(t, err, ErrInvalidParam)
	require.Zero(t, ep.UnmatchedHeld())
	rk, err := ep.UnpackRkey([]byte{1})
	require.Nil(t, rk)
	require.ErrorIs(t, err, ErrInvalidParam)
	require.Nil(t, ep.Worker())
}

func TestNilMemH(t *testing.T) {
	var m *MemH
	require.Zero(t, m.Address())
	require.Nil(t, m.Bytes())
	require.ErrorIs(t, m.Close(), ErrInvalidParam)
	require.Zero(t, m.Len())
	require.Equal(t, MemoryUnknown, m.MemoryType())
	packed, err := m.PackRkey()
	require.Nil(t, packed)
	require.ErrorIs(t, err, ErrInvalidParam)
}

func TestNilRkey(t *testing.T) {
	var r *Rkey
	require.Zero(t, r.Base())
	require.ErrorIs(t, r.Close(), ErrInvalidParam)
	require.False(t, r.Device())
	a, err := r.DeviceAddress(0, 8)
	require.Zero(t, a)
	require.ErrorIs(t, err, ErrInvalidParam)
	require.Zero(t, r.Len())
}

func TestNilListener(t *testing.T) {
	var l *Listener
	ep, err := l.Accept(context.Background(), nil)
	require.Nil(t, ep)
	require.ErrorIs(t, err, ErrInvalidParam)
	require.Empty(t, l.Addr())
	require.ErrorIs(t, l.Close(), ErrInvalidParam)
	require.Zero(t, l.Port())
	require.Zero(t, l.Refused())
}

func TestNilSignals(t *testing.T) {
	var s *Signals
	require.Zero(t, s.Addr(0))
	require.ErrorIs(t, s.Close(), ErrInvalidParam)
	require.Zero(t, s.Len())
	packed, err := s.PackRkey()
	require.Nil(t, packed)
	require.ErrorIs(t, err, ErrInvalidParam)
	require.Nil(t, s.Word(0))
}

func TestNilConnRequest(t *testing.T) {
	var r *ConnRequest
	ep, err := r.Accept(nil)
	require.Nil(t, ep)
	require.ErrorIs(t, err, ErrInvalidParam)
	require.ErrorIs(t, r.Reject(), ErrInvalidParam)
	addr, err := r.RemoteAddr()
	require.Empty(t, addr)
	require.ErrorIs(t, err, ErrInvalidParam)
}

// TestNilHandleMethods calls every exported method of the handle types on a nil
// receiver with zero arguments: a method added without a nil guard fails here.
func TestNilHandleMethods(t *testing.T) {
	testenv.NilMethods(t, (*Context)(nil), (*Worker)(nil), (*Endpoint)(nil), (*Request)(nil),
		(*MemH)(nil), (*Rkey)(nil), (*Listener)(nil), (*Signals)(nil), (*ConnRequest)(nil))
}

// The Request of a failed call is nil: its methods report that instead of crashing.
func TestNilRequest(t *testing.T) {
	var r *Request
	require.False(t, r.Done())
	require.ErrorIs(t, r.Err(), ErrInvalidParam)
	require.Zero(t, r.Length())
	require.Zero(t, r.SenderTag())
	require.Zero(t, r.Fetched())
	done, err := r.Test()
	require.False(t, done)
	require.ErrorIs(t, err, ErrInvalidParam)
	require.ErrorIs(t, r.Wait(context.Background()), ErrInvalidParam)
	b := stream.NewHostBackend()
	defer b.Close()
	s, err := b.NewStream()
	require.NoError(t, err)
	defer s.Close()
	require.ErrorIs(t, r.WaitOnStream(s), ErrInvalidParam)
	ev, err := b.NewEvent()
	require.NoError(t, err)
	require.ErrorIs(t, r.RecordEvent(ev), ErrInvalidParam)
	r.Cancel()
}
