package ucp

import (
	"context"
	"encoding/binary"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/condition"
)

// condition.Param.Timeout fails an operation that does not complete in time, releases
// the stream waiting on it, and the status word beside the completion word says so
// (what ucpx_status reads on a GPU).
func TestConditionTimeoutAndStatusWord(t *testing.T) {
	p := newShmPair(t)
	b := hostBackend(t)
	s, err := b.NewStream()
	require.NoError(t, err)
	c, err := condition.Create(condition.Param{Category: condition.Stream, Backend: b, Stream: s, Timeout: 100 * time.Millisecond})
	require.NoError(t, err)
	defer func() { require.NoError(t, c.Destroy()) }()
	_, err = condition.Create(condition.Param{Category: condition.Stream, Backend: b, Stream: s, Timeout: -1})
	require.ErrorIs(t, err, ErrInvalidParam)

	// Nobody sends tag 99: the receive times out.
	r, err := p.a.TagRecvNbx(make([]byte, 8), 99, ^uint64(0), &RequestParam{Condition: c})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	require.ErrorIs(t, r.Wait(ctx), condition.ErrTimedOut)
	require.NoError(t, s.Synchronize(), "the stream was not released")
	done, opErr := c.StatusAt(1)
	require.True(t, done)
	require.ErrorIs(t, opErr, condition.ErrTimedOut)

	// A later operation that succeeds has a clean status.
	msg := []byte("on time!")
	buf := make([]byte, 8)
	r, err = p.a.TagRecvNbx(buf, 100, ^uint64(0), &RequestParam{Condition: c})
	require.NoError(t, err)
	sr, err := p.epB.TagSendNbx(msg, 100, nil)
	require.NoError(t, err)
	p.wait(t, sr)
	require.NoError(t, r.Wait(ctx))
	require.NoError(t, s.Synchronize())
	done, opErr = c.StatusAt(2)
	require.True(t, done)
	require.NoError(t, opErr)
	require.Equal(t, msg, buf)

	// Kernel-triggered: the handle's status word (completion + 8 bytes) names the failed
	// operation, as ucpx_status reads it.
	kc, err := condition.Create(condition.Param{Category: condition.KernelTriggered, Backend: b, Timeout: 50 * time.Millisecond})
	require.NoError(t, err)
	defer func() { require.NoError(t, kc.Destroy()) }()
	_, err = p.a.TagRecvNbx(make([]byte, 8), 101, ^uint64(0), &RequestParam{Condition: kc})
	require.NoError(t, err)
	h, err := kc.DeviceHandle()
	require.NoError(t, err)
	require.NoError(t, condition.Trigger(h))
	require.Eventually(t, func() bool { return condition.Test(h) }, 20*time.Second, time.Millisecond)
	words := DeviceBuffer(h.Completion, 16) // host memory on a host backend
	require.Equal(t, h.CompletionValue, binary.LittleEndian.Uint64(words[8:]))
	done, opErr = kc.StatusAt(h.CompletionValue)
	require.True(t, done)
	require.ErrorIs(t, opErr, condition.ErrTimedOut)
}
