package ucp

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/condition"
	"github.com/ucpx/ucpx/protocol"
	"github.com/ucpx/ucpx/stream"
)

// refusingTrigger is a stream that takes everything but trigger stores, as a stream
// whose memops the driver refuses.
type refusingTrigger struct{ stream.Stream }

var errRefused = errors.New("trigger refused")

func (refusingTrigger) WriteValue(*stream.Word, uint64) error { return errRefused }
func (refusingTrigger) WriteThenWait(*stream.Word, uint64, *stream.Word, uint64, stream.Compare) error {
	return errRefused
}

// A staged send whose trigger the stream refuses after the copy into its staging buffer
// was enqueued gives that buffer back only once the copy ran: lent at once to another
// operation, the late copy overwrote that operation's data (it sent the failed one's).
func TestStagingOfRefusedTriggerWaitsForItsCopy(t *testing.T) {
	const n = 8 << 10
	p := newShmPair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b := stream.NewHostBackend()
	t.Cleanup(func() { _ = b.Close() })
	s1, err := b.NewStream()
	require.NoError(t, err)
	s2, err := b.NewStream()
	require.NoError(t, err)
	t.Cleanup(func() { _ = s1.Close(); _ = s2.Close() })
	gate, err := b.AllocWords(1)
	require.NoError(t, err)
	t.Cleanup(func() { _ = gate.Close() })
	require.NoError(t, s1.WaitValue(gate.Word(0), 1, stream.GEQ)) // s1 holds its copies back

	staged := func(c *condition.Condition) *RequestParam {
		return &RequestParam{Condition: c, Staging: protocol.StageAlways}
	}
	c1, err := condition.Create(condition.Param{Category: condition.Stream, Backend: b, Stream: refusingTrigger{s1}})
	require.NoError(t, err)
	_, err = p.epA.TagSendNbx(bytes.Repeat([]byte{0xaa}, n), 1, staged(c1))
	require.ErrorIs(t, err, errRefused)

	c2, err := condition.Create(condition.Param{Category: condition.Stream, Backend: b, Stream: s2})
	require.NoError(t, err)
	require.NoError(t, c2.BeginGroup())
	sr, err := p.epA.TagSendNbx(bytes.Repeat([]byte{0xbb}, n), 2, staged(c2))
	require.NoError(t, err)
	require.NoError(t, s2.Synchronize()) // its copy into staging ran
	gate.Word(0).Store(1)
	require.NoError(t, s1.Synchronize()) // the refused send's copy ran
	require.NoError(t, c2.EndGroup())
	got := make([]byte, n)
	_, _, err = p.b.TagRecv(ctx, got, 2, MaxTag)
	require.NoError(t, err)
	require.NoError(t, sr.Wait(ctx))
	require.Equal(t, bytes.Repeat([]byte{0xbb}, n), got, "the second send carried the refused one's data")
	require.NoError(t, s2.Synchronize())
	require.NoError(t, c1.Destroy())
	require.NoError(t, c2.Destroy())
}
