package condition

import (
	"bytes"
	"errors"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/cgo/cuda"
	"github.com/ucpx/ucpx/internal/testenv"
	"github.com/ucpx/ucpx/internal/testenv/streamenv"
	"github.com/ucpx/ucpx/protocol"
	"github.com/ucpx/ucpx/stream"
	"github.com/ucpx/ucpx/stream/streamcore"
)

// TestCaptureUnderFakeDriver runs the stream-capture tests against the fake driver.
func TestCaptureUnderFakeDriver(t *testing.T) {
	testenv.RunUnderFakeDriver(t, []string{"TestFakeDriverCaptureRefusedRecordsNothing", "TestFakeDriverFailedGraphConditionDestroyedAfterReset",
		"TestFakeDriverCapturePartlyRefusedLeavesNothingToRun"})
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
	launchCaptured(t, g2, 3, cs, s, "trigger store, completion wait, completion reset")
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
				awaitIssued(t, e, op)
				require.NoError(t, e.Close()) // fails the launch's operation for good
			} else {
				require.NoError(t, e.Close())
				require.Equal(t, GraphFailed, gc.done.Load())
				require.NoError(t, x.Launch(cs))
			}
			syncWithin(t, s, 30*time.Second) // the captured graph's launch
			require.Zero(t, gc.done.Load(), "the completion node reset GraphFailed")
			require.ErrorIs(t, o.Wait(t.Context()), ErrClosed)

			require.NoError(t, c.Destroy(), "Destroy of the Stream condition owning the failed graph condition")
			require.True(t, gc.Destroyed())
			require.True(t, gc.words.Closed(), "the failed graph condition's words were not freed")
		})
	}
}

// partCapture is a CUDA stream that, while refuse is set, refuses one of a captured
// operation's signal memops (the completion wait, or the reset of the completion
// word after it) and records the word the first memop stored into. With invalidates,
// it plays a driver that invalidates a capture when the capturing stream is queried.
type partCapture struct {
	streamcore.Stream
	refuseReset bool // refuse the reset rather than the wait
	invalidates bool
	refuse      atomic.Bool
	invalidated atomic.Bool
	stored      atomic.Pointer[streamcore.Word]
}

var errMemopRefused = errors.New("memop refused")

func (s *partCapture) WriteValue(w *streamcore.Word, v uint64) error {
	if s.refuse.Load() {
		if v == 0 && s.refuseReset {
			return errMemopRefused
		}
		if v == 1 {
			s.stored.Store(w)
		}
	}
	return s.Stream.WriteValue(w, v)
}

func (s *partCapture) WaitValue(w *streamcore.Word, v uint64, cmp streamcore.Compare) error {
	if s.refuse.Load() && !s.refuseReset {
		return errMemopRefused
	}
	return s.Stream.WaitValue(w, v, cmp)
}

func (s *partCapture) Query() (bool, error) {
	if capturing, _ := s.Stream.Capturing(); capturing && s.invalidates {
		s.invalidated.Store(true)
		return false, errors.New("operation not permitted when stream is capturing")
	}
	return s.Stream.Query()
}

func (s *partCapture) Capturing() (bool, error) {
	capturing, err := s.Stream.Capturing()
	if capturing && s.invalidated.Load() {
		return false, errors.New("capture invalidated")
	}
	return capturing, err
}

// A captured operation whose stream takes the first of its signal memops and refuses
// the next (the completion wait, or the reset after it) leaves the capture nothing to
// run: the call fails, saying the capture was invalidated (a driver that invalidates a
// capture whose stream is queried) or that its graph must be discarded; the words the
// captured nodes name stay allocated, failed for good, until the Stream condition is
// destroyed; a launch of the captured graph neither waits for good nor writes freed
// memory. Before, the condition made for the operation was dropped with its words
// freed under the nodes the capture kept: every launch stored into freed memory, and,
// with the wait captured, waited on it.
func TestFakeDriverCapturePartlyRefusedLeavesNothingToRun(t *testing.T) {
	for _, tc := range []struct {
		name                     string
		refuseReset, invalidates bool
		nodes                    int
	}{
		{"wait-refused", false, false, 1},
		{"reset-refused", true, false, 2},
		{"wait-refused-invalidating-driver", false, true, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := streamenv.CUDABackend(t)
			raw, err := b.NewStream()
			require.NoError(t, err)
			cs, ok := stream.CUDAStream(raw)
			require.True(t, ok)
			s := &partCapture{Stream: raw, refuseReset: tc.refuseReset, invalidates: tc.invalidates}
			c, err := Create(Param{Category: Stream, Backend: b, Stream: s})
			require.NoError(t, err)
			e, err := NewEngine(idleTransport{}, protocol.Config{}, false)
			require.NoError(t, err)
			t.Cleanup(func() { _ = e.Close() })

			require.NoError(t, cs.BeginCapture(cuda.CaptureRelaxed))
			s.refuse.Store(true)
			var refused Op
			err = e.Submit(&refused, c, &instant{data: make([]byte, 8)}, Submission{What: "recv",
				Transfer: protocol.Transfer{Buf: make([]byte, 8), Dir: protocol.In}})
			s.refuse.Store(false)
			require.ErrorIs(t, err, errMemopRefused)
			// A real driver invalidates a capture whose stream is queried (the fake
			// one does not): the error then says so, whatever the wrapper plays.
			rawCapturing, rawErr := raw.Capturing()
			driverInvalidated := rawErr != nil || !rawCapturing
			if tc.invalidates || driverInvalidated {
				require.ErrorContains(t, err, "the capture is invalidated")
			} else {
				require.ErrorContains(t, err, "discard the graph it gives")
			}
			if tc.invalidates {
				_, cerr := s.Capturing()
				require.Error(t, cerr, "the capture was not invalidated")
			}
			require.False(t, refused.Submitted())
			words := s.stored.Load()
			require.NotNil(t, words, "the trigger store was not captured")
			require.False(t, words.Block().Closed(), "the words the captured nodes name were freed")

			g, err := cs.EndCapture()
			if driverInvalidated {
				require.Error(t, err, "an invalidated capture gave a graph")
			} else {
				require.NoError(t, err)
				defer g.Close()
				launchCaptured(t, g, tc.nodes, cs, raw, "the nodes the capture took")
			}
			require.False(t, words.Block().Closed())

			// The Stream condition still works, and its Destroy frees the words.
			var o Op
			want := []byte("after...")
			got := make([]byte, len(want))
			require.NoError(t, e.Submit(&o, c, &instant{data: want}, Submission{What: "recv",
				Transfer: protocol.Transfer{Buf: got, Dir: protocol.In}}))
			require.NoError(t, o.Wait(t.Context()))
			require.NoError(t, raw.Synchronize())
			require.Equal(t, want, got)
			require.NoError(t, c.Destroy())
			require.True(t, words.Block().Closed(), "Destroy did not free the words of the partly captured operation")
		})
	}
}

// launchCaptured checks that the captured graph g holds n nodes (what they are), then
// launches it on cs and waits, bounded, for s (cs's stream) to pass the launch.
func launchCaptured(t *testing.T, g *cuda.Graph, n int, cs *cuda.Stream, s streamcore.Stream, what string) {
	t.Helper()
	nodes, err := g.Nodes()
	require.NoError(t, err)
	require.Len(t, nodes, n, what)
	x, err := g.Instantiate(0)
	require.NoError(t, err)
	defer x.Close()
	require.NoError(t, x.Launch(cs))
	syncWithin(t, s, 30*time.Second)
}
