package condition

import (
	"bytes"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/cgo/cuda"
	"github.com/ucpx/ucpx/internal/testenv"
	"github.com/ucpx/ucpx/internal/testenv/streamenv"
	"github.com/ucpx/ucpx/protocol"
	"github.com/ucpx/ucpx/stream"
)

// TestCaptureUnderFakeDriver runs the stream-capture tests against the fake driver.
func TestCaptureUnderFakeDriver(t *testing.T) {
	testenv.RunUnderFakeDriver(t, []string{"TestFakeDriverCaptureRefusedRecordsNothing", "TestFakeDriverFailedGraphConditionDestroyedAfterReset"})
}

// A conditioned call refused under stream capture (here: a device buffer, which a
// graph operation cannot stage without a device, and an unknown staging policy)
// records nothing in the captured graph. Before, the refused call left the graph
// condition's trigger store, completion wait and reset in the capture, with no
// operation behind them: every launch of the graph waited for good. An operation
// accepted under the same capture still records its three nodes, and a launch of the
// graph runs it.
func TestFakeDriverCaptureRefusedRecordsNothing(t *testing.T) {
	b := streamenv.CUDABackend(t)
	ctx, _, ok := stream.CUDAContext(b)
	require.True(t, ok)
	s, err := b.NewStream()
	require.NoError(t, err)
	cs, ok := stream.CUDAStream(s)
	require.True(t, ok)
	c, err := Create(Param{Category: Stream, Backend: b, Stream: s})
	require.NoError(t, err)
	e, err := NewEngine(idleTransport{}, protocol.Config{}, false)
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Close() })

	const n = 4096
	dev, err := ctx.MemAlloc(n)
	require.NoError(t, err)
	defer dev.Close()
	devBuf := unsafe.Slice((*byte)(unsafe.Add(unsafe.Pointer(nil), dev.Ptr())), n)

	require.NoError(t, cs.BeginCapture(cuda.CaptureRelaxed))
	var refused Op
	err = e.Submit(&refused, c, &instant{data: make([]byte, n)}, Submission{What: "recv",
		Transfer: protocol.Transfer{Buf: devBuf, Dir: protocol.In, DeclaredDevice: true}})
	require.ErrorIs(t, err, protocol.ErrUnsupported, "a device buffer under capture, with no device to stage through")
	require.False(t, refused.Submitted())
	var badPolicy Op
	err = e.Submit(&badPolicy, c, &instant{data: make([]byte, 8)}, Submission{What: "recv",
		Transfer: protocol.Transfer{Buf: make([]byte, 8), Dir: protocol.In, Staging: protocol.Staging(99)}})
	require.ErrorIs(t, err, ErrInvalidParam, "an unknown staging policy")
	require.False(t, badPolicy.Submitted())
	g, err := cs.EndCapture()
	require.NoError(t, err)
	defer g.Close()
	nodes, err := g.Nodes()
	require.NoError(t, err)
	require.Empty(t, nodes, "a refused call under capture left nodes in the captured graph")
	require.Empty(t, c.captured, "a refused call under capture made a graph condition")

	// Accepted under capture: its signal nodes are the graph's, and a launch runs it.
	want := bytes.Repeat([]byte{0x3c}, 64)
	got := make([]byte, len(want))
	require.NoError(t, cs.BeginCapture(cuda.CaptureRelaxed))
	var accepted Op
	require.NoError(t, e.Submit(&accepted, c, &instant{data: want}, Submission{What: "recv",
		Transfer: protocol.Transfer{Buf: got, Dir: protocol.In}}))
	g2, err := cs.EndCapture()
	require.NoError(t, err)
	defer g2.Close()
	nodes, err = g2.Nodes()
	require.NoError(t, err)
	require.Len(t, nodes, 3, "trigger store, completion wait, completion reset")
	x, err := g2.Instantiate(0)
	require.NoError(t, err)
	defer x.Close()
	require.NoError(t, x.Launch(cs))
	done := make(chan error, 1)
	go func() { done <- s.Synchronize() }()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		require.FailNow(t, "the captured graph's launch hung")
	}
	require.NoError(t, c.Destroy())
	require.NoError(t, accepted.Wait(t.Context()), "a captured operation completes with its condition")
	// Read once the Op completed: the race detector does not see the driver's ordering.
	require.Equal(t, want, got)
}

// A Graph condition whose operation failed for good (its engine closed) is destroyed,
// and its words freed, also after a CUDA graph's completion node, released by
// GraphFailed, reset the completion word to 0: here the captured graph of a Stream
// condition's operation, launched after the engine closed, or in flight when it
// closed. Before, Destroy read the words: with the trigger the launch stored it refused
// (ErrBusy) for good, so the Stream condition could not be destroyed either; with
// both words 0 it succeeded but left the words to an engine that was gone, and they
// were never freed.
func TestFakeDriverFailedGraphConditionDestroyedAfterReset(t *testing.T) {
	for _, when := range []string{"launched-after-close", "in-flight-at-close"} {
		t.Run(when, func(t *testing.T) {
			b := streamenv.CUDABackend(t)
			s, err := b.NewStream()
			require.NoError(t, err)
			cs, ok := stream.CUDAStream(s)
			require.True(t, ok)
			c, err := Create(Param{Category: Stream, Backend: b, Stream: s})
			require.NoError(t, err)
			tr := &heldTransport{}
			e, err := NewEngine(tr, protocol.Config{}, false)
			require.NoError(t, err)
			t.Cleanup(func() { _ = e.Close() })
			op := &heldOp{t: tr, issued: make(chan struct{}, 1)}

			require.NoError(t, cs.BeginCapture(cuda.CaptureRelaxed))
			var o Op
			require.NoError(t, e.Submit(&o, c, op, Submission{What: "recv", Transfer: protocol.Transfer{Buf: make([]byte, 8), Dir: protocol.In}}))
			g, err := cs.EndCapture()
			require.NoError(t, err)
			defer g.Close()
			require.Len(t, c.captured, 1)
			gc := c.captured[0]
			x, err := g.Instantiate(0)
			require.NoError(t, err)
			defer x.Close()

			if when == "in-flight-at-close" {
				require.NoError(t, x.Launch(cs))
				driveUntil(t, e, "issue", func() bool {
					select {
					case <-op.issued:
						return true
					default:
						return false
					}
				})
				require.NoError(t, e.Close()) // fails the launch's operation for good
			} else {
				require.NoError(t, e.Close())
				require.Equal(t, GraphFailed, gc.done.Load())
				require.NoError(t, x.Launch(cs))
			}
			done := make(chan error, 1)
			go func() { done <- s.Synchronize() }()
			select {
			case err := <-done:
				require.NoError(t, err)
			case <-time.After(30 * time.Second):
				require.FailNow(t, "the captured graph's launch hung")
			}
			require.Zero(t, gc.done.Load(), "the completion node reset GraphFailed")
			require.ErrorIs(t, o.Wait(t.Context()), ErrClosed)

			require.NoError(t, c.Destroy(), "Destroy of the Stream condition owning the failed graph condition")
			require.True(t, gc.Destroyed())
			require.True(t, gc.words.Closed(), "the failed graph condition's words were not freed")
		})
	}
}
