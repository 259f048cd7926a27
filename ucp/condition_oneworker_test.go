package ucp

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/condition"
)

// A condition serves the operations of one worker: an operation of a second worker
// (a second engine) on it is refused with ErrInvalidParam, and the first worker's
// operations complete, in order, as if the attempt had not been made. Before, each
// engine retired its own operations: B's receive, answered first, moved the completion
// word past A's, which had no data yet, so an event recorded after both was ready and
// StatusAt(1) said done while A's receive was in flight (and Destroy succeeded then).
func TestConditionRefusesSecondWorkersOperation(t *testing.T) {
	p := newShmPair(t)
	b := hostBackend(t)
	s, c := bareStreamCondition(t, b)
	bufA := make([]byte, 8)
	require.NoError(t, c.BeginGroup())
	ra, err := p.a.TagRecvNbx(bufA, 1, ^uint64(0), &RequestParam{Condition: c}) // seq 1 on worker A
	require.NoError(t, err)
	rb, err := p.b.TagRecvNbx(make([]byte, 8), 2, ^uint64(0), &RequestParam{Condition: c})
	require.ErrorIs(t, err, ErrInvalidParam, "a receive of a second worker on the condition")
	require.ErrorIs(t, err, condition.ErrInvalidParam)
	require.Nil(t, rb)
	require.NoError(t, c.EndGroup())
	require.Equal(t, 1, c.Pending(), "the refused operation was not armed")
	ev, err := b.NewEvent()
	require.NoError(t, err)
	require.NoError(t, s.Record(ev))

	// Nothing answers A's receive yet: nothing may say it completed.
	time.Sleep(20 * time.Millisecond)
	ready, err := ev.Query()
	require.NoError(t, err)
	require.False(t, ready, "event recorded after the receive is ready before its data arrived")
	done, _ := c.StatusAt(1)
	require.False(t, done)
	require.False(t, ra.Done())
	require.ErrorIs(t, c.Destroy(), condition.ErrBusy, "Destroy with the receive in flight")

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sa, err := p.epB.TagSendNbx([]byte("AAAAAAAA"), 1, nil)
	require.NoError(t, err)
	require.NoError(t, ra.Wait(ctx))
	require.NoError(t, sa.Wait(ctx))
	require.Equal(t, "AAAAAAAA", string(bufA))
	require.NoError(t, s.Synchronize())
	ready, err = ev.Query()
	require.NoError(t, err)
	require.True(t, ready)
	done, opErr := c.StatusAt(1)
	require.True(t, done)
	require.NoError(t, opErr)
	require.Zero(t, c.Pending())
	require.NoError(t, c.Destroy())
}

// The same for a KernelTriggered condition: the first worker's operation binds it.
func TestKernelConditionRefusesSecondWorker(t *testing.T) {
	p := newShmPair(t)
	kc, trigger := kernelCondition(t)
	bufA := make([]byte, 8)
	ra, err := p.a.TagRecvNbx(bufA, 3, ^uint64(0), &RequestParam{Condition: kc})
	require.NoError(t, err)
	_, err = p.b.TagRecvNbx(make([]byte, 8), 4, ^uint64(0), &RequestParam{Condition: kc})
	require.ErrorIs(t, err, ErrInvalidParam)
	trigger()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sa, err := p.epB.TagSendNbx([]byte("kkkkkkkk"), 3, nil)
	require.NoError(t, err)
	require.NoError(t, ra.Wait(ctx))
	require.NoError(t, sa.Wait(ctx))
	require.Equal(t, "kkkkkkkk", string(bufA))
	require.Zero(t, kc.Pending())
}

// A condition whose worker closed, with every operation retired, serves the next
// worker.
func TestConditionServesNextWorkerAfterClose(t *testing.T) {
	p := newShmPair(t)
	kc, trigger := kernelCondition(t)
	r, err := p.a.TagRecvNbx(make([]byte, 8), 5, ^uint64(0), &RequestParam{Condition: kc})
	require.NoError(t, err)
	require.NoError(t, p.a.Close())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.ErrorIs(t, r.Wait(ctx), ErrClosed, "closed with its worker")
	require.Zero(t, kc.Pending())

	rb, err := p.b.TagRecvNbx(make([]byte, 8), 6, ^uint64(0), &RequestParam{Condition: kc})
	require.NoError(t, err, "the condition's worker closed: the next worker may use it")
	trigger()
	rb.Cancel() // issued or not: it completes with ErrCanceled
	require.ErrorIs(t, rb.Wait(ctx), ErrCanceled)
	require.Zero(t, kc.Pending())
}
