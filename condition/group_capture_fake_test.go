package condition

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/cgo/cuda"
	"github.com/ucpx/ucpx/internal/testenv"
	"github.com/ucpx/ucpx/internal/testenv/streamenv"
	"github.com/ucpx/ucpx/protocol"
	"github.com/ucpx/ucpx/stream"
)

// TestGroupCaptureUnderFakeDriver runs the group-under-capture test against the fake
// driver.
func TestGroupCaptureUnderFakeDriver(t *testing.T) {
	testenv.RunUnderFakeDriver(t, []string{"TestFakeDriverEndGroupRefusedWhileCapturing"})
}

// A group opened and armed on the live stream, ended while the stream captures a
// graph: EndGroup is refused (ErrInvalidParam, as RecordEvent), records nothing in the
// capture, and keeps the group open; EndGroup after EndCapture triggers it on the live
// stream and its operation completes. Before, EndGroup enqueued the group's trigger and
// completion wait into the captured graph: the live stream never triggered the
// operation, which stayed pending (Pending 1, Destroy ErrBusy) for good.
func TestFakeDriverEndGroupRefusedWhileCapturing(t *testing.T) {
	b := streamenv.CUDABackend(t)
	s, err := b.NewStream()
	require.NoError(t, err)
	defer s.Close()
	cs, ok := stream.CUDAStream(s)
	require.True(t, ok)
	c, err := Create(Param{Category: Stream, Backend: b, Stream: s})
	require.NoError(t, err)
	e, err := NewEngine(idleTransport{}, protocol.Config{}, false)
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Close() })

	require.NoError(t, c.BeginGroup())
	got := make([]byte, 8)
	var o Op
	require.NoError(t, e.Submit(&o, c, &instant{data: []byte("12345678")}, Submission{What: "recv",
		Transfer: protocol.Transfer{Buf: got, Dir: protocol.In}}))
	require.NoError(t, cs.BeginCapture(cuda.CaptureRelaxed))
	require.ErrorIs(t, c.EndGroup(), ErrInvalidParam, "EndGroup while the stream captures")
	g, err := cs.EndCapture()
	require.NoError(t, err, "the refused EndGroup left the capture usable")
	nodes, err := g.Nodes()
	require.NoError(t, err)
	require.Empty(t, nodes, "the refused EndGroup recorded nodes in the captured graph")
	require.NoError(t, g.Close())
	require.Equal(t, 1, c.Pending())

	require.NoError(t, c.EndGroup(), "the group stayed open: EndGroup after EndCapture ends it")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(t, o.Wait(ctx), "the group's operation runs on the live stream")
	require.Equal(t, "12345678", string(got))
	require.NoError(t, s.Synchronize())
	require.Zero(t, c.Pending())
	require.ErrorIs(t, c.EndGroup(), ErrInvalidParam, "no group is open any more")
	require.NoError(t, c.Destroy())
}
