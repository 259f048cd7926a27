package tests

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/bootstrap"
	"github.com/ucpx/ucpx/cgo/cuda"
	"github.com/ucpx/ucpx/condition"
	"github.com/ucpx/ucpx/graph"
	"github.com/ucpx/ucpx/protocol"
	"github.com/ucpx/ucpx/stream"
	"github.com/ucpx/ucpx/ucp"
)

// One error vocabulary: every exported sentinel matches the shared root it stands
// for (and only the roots it stands for), whichever package found the error, and
// every not-supported error matches errors.ErrUnsupported.
func TestErrorVocabulary(t *testing.T) {
	roots := map[string]error{
		"invalid":     ucp.ErrInvalidParam,
		"closed":      ucp.ErrClosed,
		"unsupported": ucp.ErrUnsupported,
		"busy":        ucp.ErrBusy,
		"canceled":    ucp.ErrCanceled,
		"timedout":    ucp.ErrTimedOut,
	}
	for _, tc := range []struct {
		name string
		err  error
		is   []string // the roots it must match; every other root must not match
	}{
		{"ucp.ErrInvalidParam", ucp.ErrInvalidParam, []string{"invalid"}},
		{"ucp.ErrClosed", ucp.ErrClosed, []string{"closed"}},
		{"ucp.ErrUnsupported", ucp.ErrUnsupported, []string{"unsupported"}},
		{"ucp.ErrBusy", ucp.ErrBusy, []string{"busy"}},
		{"ucp.ErrCanceled", ucp.ErrCanceled, []string{"canceled"}},
		{"ucp.ErrNotImplemented", ucp.ErrNotImplemented, []string{"unsupported"}},
		{"ucp.ErrOutOfRange", ucp.ErrOutOfRange, nil},
		{"ucp.ErrPeerFailed", ucp.ErrPeerFailed, nil},
		{"UCS_ERR_INVALID_PARAM", ucp.Status(-5), []string{"invalid"}},
		{"UCS_ERR_UNSUPPORTED", ucp.Status(-22), []string{"unsupported"}},
		{"UCS_ERR_BUSY", ucp.Status(-15), []string{"busy"}},
		{"UCS_ERR_CANCELED", ucp.Status(-16), []string{"canceled"}},
		{"condition.ErrInvalidParam", condition.ErrInvalidParam, []string{"invalid"}},
		{"condition.ErrClosed", condition.ErrClosed, []string{"closed"}},
		{"condition.ErrDestroyed", condition.ErrDestroyed, []string{"closed"}},
		{"condition.ErrBusy", condition.ErrBusy, []string{"busy"}},
		{"condition.ErrCanceled", condition.ErrCanceled, []string{"canceled"}},
		{"ucp.ErrTimedOut", ucp.ErrTimedOut, []string{"timedout"}},
		{"UCS_ERR_TIMED_OUT", ucp.Status(-20), []string{"timedout"}},
		{"condition.ErrTimedOut", condition.ErrTimedOut, []string{"timedout"}},
		{"bootstrap.ErrTimedOut", bootstrap.ErrTimedOut, []string{"timedout"}},
		{"stream.ErrInvalidArgument", stream.ErrInvalidArgument, []string{"invalid"}},
		{"stream.ErrClosed", stream.ErrClosed, []string{"closed"}},
		{"stream.ErrNotSupported", stream.ErrNotSupported, []string{"unsupported"}},
		{"stream.ErrWrongBackend", stream.ErrWrongBackend, []string{"invalid"}},
		{"graph.ErrInvalidParam", graph.ErrInvalidParam, []string{"invalid"}},
		{"graph.ErrClosed", graph.ErrClosed, []string{"closed"}},
		{"graph.ErrInFlight", graph.ErrInFlight, []string{"busy"}},
		{"graph.ErrCycle", graph.ErrCycle, []string{"invalid"}},
		{"graph.ErrOperationFailed", graph.ErrOperationFailed, []string{"closed"}},
		{"protocol.ErrClosed", protocol.ErrClosed, []string{"closed"}},
		{"protocol.ErrInvalidParam", protocol.ErrInvalidParam, []string{"invalid"}},
		{"protocol.ErrUnsupported", protocol.ErrUnsupported, []string{"unsupported"}},
		{"cuda.ErrNotSupported", cuda.ErrNotSupported, []string{"unsupported"}},
		{"cuda.ErrInvalidValue", cuda.ErrInvalidValue, []string{"invalid"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wrapped := &ucp.OpError{Op: "test", Err: tc.err}
			for name, root := range roots {
				want := false
				for _, r := range tc.is {
					want = want || r == name
				}
				require.Equal(t, want, errors.Is(tc.err, root), "errors.Is(%v, %s root)", tc.err, name)
				require.Equal(t, want, errors.Is(wrapped, root), "wrapped in OpError, %s root", name)
			}
			unsupported := false
			for _, r := range tc.is {
				unsupported = unsupported || r == "unsupported"
			}
			require.Equal(t, unsupported, errors.Is(tc.err, errors.ErrUnsupported), "errors.ErrUnsupported")
		})
	}
}

// The errors each package really returns match the shared roots through ucp's names.
func TestErrorsFromEveryPackage(t *testing.T) {
	b, err := stream.Open(stream.Host)
	require.NoError(t, err)
	defer b.Close()
	s, err := b.NewStream()
	require.NoError(t, err)

	// condition: a bad parameter, a destroyed condition.
	_, err = condition.Create(condition.Param{Category: condition.Stream, Backend: b})
	require.ErrorIs(t, err, ucp.ErrInvalidParam)
	c, err := condition.Create(condition.Param{Category: condition.Stream, Backend: b, Stream: s})
	require.NoError(t, err)
	require.NoError(t, c.Destroy())
	require.ErrorIs(t, c.Destroy(), ucp.ErrClosed)

	// graph: a cycle, a closed graph.
	g := graph.NewHost()
	n1, err := g.AddTask(nil, func() error { return nil })
	require.NoError(t, err)
	n2, err := g.AddTask([]condition.Node{n1}, func() error { return nil })
	require.NoError(t, err)
	require.NoError(t, g.AddDependencies(n2, n1))
	_, err = g.Instantiate()
	require.ErrorIs(t, err, ucp.ErrInvalidParam)
	require.NoError(t, g.Close())

	// stream: a closed stream, a nil word.
	require.ErrorIs(t, s.WriteValue(nil, 1), ucp.ErrInvalidParam)
	words, err := b.AllocWords(1)
	require.NoError(t, err)
	defer words.Close()
	require.NoError(t, s.Close())
	require.ErrorIs(t, s.WriteValue(words.Word(0), 1), ucp.ErrClosed)

	// ucp: device memory without a transport for it, a closed worker, a closed rkey
	// range, a MemoryType CUDA on a host-stream condition (found at the call).
	uctx, err := ucp.NewContext(ucp.ContextParams{})
	require.NoError(t, err)
	defer uctx.Close()
	w, err := uctx.NewWorker(ucp.WorkerParams{})
	require.NoError(t, err)
	_, err = w.TagRecvNbx(make([]byte, 8), 1, ^uint64(0), &ucp.RequestParam{MemoryType: ucp.MemoryCUDA})
	require.ErrorIs(t, err, ucp.ErrUnsupported)
	require.ErrorIs(t, err, errors.ErrUnsupported)
	s2, err := b.NewStream()
	require.NoError(t, err)
	defer s2.Close()
	c2, err := condition.Create(condition.Param{Category: condition.Stream, Backend: b, Stream: s2})
	require.NoError(t, err)
	defer c2.Destroy()
	_, err = w.TagRecvNbx(make([]byte, 8), 1, ^uint64(0), &ucp.RequestParam{MemoryType: ucp.MemoryCUDA, Condition: c2})
	require.ErrorIs(t, err, ucp.ErrInvalidParam)
	require.Contains(t, err.Error(), "host-stream")
	require.Zero(t, c2.Pending(), "nothing was armed")
	require.NoError(t, w.Close())
	_, err = w.TagRecvNbx(make([]byte, 8), 1, ^uint64(0), nil)
	require.ErrorIs(t, err, ucp.ErrClosed)

}
