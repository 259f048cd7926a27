package condition

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/protocol"
	"github.com/ucpx/ucpx/stream/streamcore"
)

// A Graph condition's launch played by hand: the test stores the trigger as a graph's
// start node does and resets the completion word as its wait node does, and the
// operation completes when the test says.

// wordsOnly is a graph that adds no nodes: the test plays them.
type wordsOnly struct{}

func (wordsOnly) Kind() streamcore.Kind { return streamcore.KindHost }

func (wordsOnly) AddSignalNodes([]Node, *streamcore.Word, *streamcore.Word, bool) (Node, Node, error) {
	return nil, nil, nil
}

// heldTransport counts completions the test makes, and may say it is closing.
type heldTransport struct {
	completions atomic.Uint64
	closing     atomic.Bool
}

func (t *heldTransport) Progress(Issued) bool { return false }
func (t *heldTransport) Completions() uint64  { return t.completions.Load() }
func (t *heldTransport) Closing() bool        { return t.closing.Load() }

// heldOp is an operation that stays in flight until finish; issued receives once per
// issue.
type heldOp struct {
	t      *heldTransport
	issued chan struct{}
	cur    atomic.Pointer[heldIssued]
}

type heldIssued struct {
	done atomic.Bool
	err  error
}

func (i *heldIssued) Done() bool { return i.done.Load() }
func (i *heldIssued) Err() error { return i.err }
func (i *heldIssued) Cancel()    {}

func (o *heldOp) Issue(*protocol.Part) (Issued, error) {
	i := &heldIssued{}
	o.cur.Store(i)
	o.issued <- struct{}{}
	return i, nil
}

// finish completes the issued operation with err.
func (o *heldOp) finish(err error) {
	i := o.cur.Load()
	i.err = err
	i.done.Store(true)
	o.t.completions.Add(1)
}

// heldLaunch makes a Graph condition carrying one heldOp on an engine of its own.
func heldLaunch(t *testing.T) (*Engine, *heldTransport, *Condition, *heldOp, *Op) {
	t.Helper()
	tr := &heldTransport{}
	e, err := NewEngine(tr, protocol.Config{}, false)
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Close() })
	c, err := Create(Param{Category: Graph, Backend: backend(t), Graph: wordsOnly{}})
	require.NoError(t, err)
	op := &heldOp{t: tr, issued: make(chan struct{}, 1)}
	var o Op
	require.NoError(t, e.Submit(&o, c, op, Submission{What: "recv", Transfer: protocol.Transfer{Buf: make([]byte, 8), Dir: protocol.In}}))
	return e, tr, c, op, &o
}

// driveUntil drives e until cond holds; the test fails if it does not within a
// generous bound (a hang).
func driveUntil(t *testing.T, e *Engine, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		require.True(t, time.Now().Before(deadline), "%s: not within 20 s", what)
		e.Drive()
		time.Sleep(10 * time.Microsecond)
	}
}

// launch stores the trigger as a start node does and waits until the engine issued
// the operation.
func launchHeld(t *testing.T, e *Engine, c *Condition, op *heldOp) {
	t.Helper()
	c.trigger.Store(1)
	awaitIssued(t, e, op)
}

// awaitIssued drives e until it issued op.
func awaitIssued(t *testing.T, e *Engine, op *heldOp) {
	t.Helper()
	driveUntil(t, e, "issue", func() bool {
		select {
		case <-op.issued:
			return true
		default:
			return false
		}
	})
}

// Destroy of a Graph condition whose operation a launch runs (the engine took the
// trigger, the operation is in flight: both words read 0) refuses with ErrBusy and
// changes nothing, as its documentation says; once the launch took the completion it
// succeeds. Before, it succeeded while the operation was in flight.
func TestGraphDestroyRefusedWhileTheOperationRuns(t *testing.T) {
	e, _, c, op, o := heldLaunch(t)
	launchHeld(t, e, c, op)
	require.Zero(t, c.trigger.Load(), "the engine took the trigger")
	require.Zero(t, c.done.Load())
	require.ErrorIs(t, c.Destroy(), ErrBusy, "Destroy with the operation in flight")
	require.False(t, c.Destroyed())

	op.finish(nil)
	driveUntil(t, e, "completion", func() bool { return c.done.Load() == 1 })
	require.ErrorIs(t, c.Destroy(), ErrBusy, "Destroy before the launch took the completion")
	c.done.Store(0) // the wait node takes it

	// A second launch: refused again while it runs.
	launchHeld(t, e, c, op)
	require.ErrorIs(t, c.Destroy(), ErrBusy)
	op.finish(nil)
	driveUntil(t, e, "completion", func() bool { return c.done.Load() == 1 })
	c.done.Store(0)

	require.NoError(t, c.Destroy())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	require.NoError(t, o.Wait(ctx), "the operation ends with its condition")
	require.NoError(t, c.Err())
}

// A launch whose operation fails as the transport closes (a worker's Close cancels
// what is in flight) marks the condition failed for good (GraphFailed: a host graph's
// wait node fails the launch), ends the operation and lets Destroy free the words.
// Before, the engine stored 1, and the launch went on as if the operation had done its
// work. A launch whose operation fails while the transport runs on (a canceled
// receive, a dead peer) still completes (1) with the error in the condition.
func TestGraphLaunchFailedByClosingTransportFailsForGood(t *testing.T) {
	errCanceled := fmt.Errorf("receive: %w", ErrCanceled)
	for _, closing := range []bool{false, true} {
		t.Run(fmt.Sprintf("closing=%v", closing), func(t *testing.T) {
			e, tr, c, op, o := heldLaunch(t)
			launchHeld(t, e, c, op)
			tr.closing.Store(closing)
			op.finish(errCanceled)
			driveUntil(t, e, "completion", func() bool { return c.done.Load() != 0 })
			require.ErrorIs(t, c.Err(), ErrCanceled)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			if !closing {
				require.EqualValues(t, 1, c.done.Load(), "a failed launch completes")
				require.False(t, o.Done(), "the operation runs again at the next launch")
				c.done.Store(0)
				require.NoError(t, c.Destroy())
				require.ErrorIs(t, o.Wait(ctx), ErrCanceled, "the operation ends with its condition, with the launch's error")
				return
			}
			require.Equal(t, GraphFailed, c.done.Load(), "a launch the closing transport failed")
			require.ErrorIs(t, o.Wait(ctx), ErrClosed, "the operation can run no more")
			require.NoError(t, c.Destroy())
			require.True(t, c.words.Closed(), "Destroy frees the words of a condition failed for good")
		})
	}
}

// A completion no launch waits for (Engine.OweCompletion: a host graph's launch failed
// with the operation in flight and left) does not keep Destroy refusing once the
// operation completed; while the operation runs Destroy still refuses, and once a
// launch took the completion (owed false) a stored completion is the waiting launch's
// again. Before, Destroy refused until a relaunch took the completion.
func TestGraphDestroyOwedCompletion(t *testing.T) {
	e, _, c, op, o := heldLaunch(t)
	require.False(t, e.OweCompletion(c.trigger, true), "not a completion word")

	// A failed launch left; a later one took the completion and waits for its own.
	launchHeld(t, e, c, op)
	require.True(t, e.OweCompletion(c.done, true))
	op.finish(nil)
	driveUntil(t, e, "completion", func() bool { return c.done.Load() == 1 })
	c.done.Store(0) // the next launch takes it first
	require.True(t, e.OweCompletion(c.done, false))
	launchHeld(t, e, c, op)
	op.finish(nil)
	driveUntil(t, e, "completion", func() bool { return c.done.Load() == 1 })
	require.ErrorIs(t, c.Destroy(), ErrBusy, "Destroy before the waiting launch took the completion")
	c.done.Store(0)

	// A launch fails and leaves: Destroy refuses while the operation runs, and
	// succeeds once it completed, with nothing taking the completion.
	launchHeld(t, e, c, op)
	require.True(t, e.OweCompletion(c.done, true))
	require.ErrorIs(t, c.Destroy(), ErrBusy, "Destroy with the operation in flight")
	op.finish(nil)
	driveUntil(t, e, "completion", func() bool { return c.done.Load() == 1 })
	require.NoError(t, c.Destroy(), "Destroy once the owed operation completed")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	require.NoError(t, o.Wait(ctx), "the operation ends with its condition")
	driveUntil(t, e, "words freed", func() bool { return c.words.Closed() })
	require.False(t, e.OweCompletion(c.done, false), "the condition left the engine")
}

// heldOn makes a Graph condition carrying one heldOp on e.
func heldOn(t *testing.T, e *Engine, tr *heldTransport) (*Condition, *heldOp) {
	t.Helper()
	c, err := Create(Param{Category: Graph, Backend: backend(t), Graph: wordsOnly{}})
	require.NoError(t, err)
	op := &heldOp{t: tr, issued: make(chan struct{}, 1)}
	var o Op
	require.NoError(t, e.Submit(&o, c, op, Submission{What: "recv", Transfer: protocol.Transfer{Buf: make([]byte, 8), Dir: protocol.In}}))
	return c, op
}

// follows is the number of followers e holds armed, checked against its entries.
func follows(t *testing.T, e *Engine) int {
	t.Helper()
	e.followMu.Lock()
	defer e.followMu.Unlock()
	n := 0
	for _, list := range e.follows {
		n += len(list)
	}
	require.EqualValues(t, n, e.nfollow.Load(), "nfollow")
	return n
}

// The engine keeps no follower armed on a completion word that never fires again, nor
// one whose condition it let go of: Follow refuses the completion word of a condition
// destroyed (and freed), failed for good, or of a closed engine, and a condition's
// leaving drops the followers armed on it and its own trigger from the lists of
// others. Before, Follow took them all: a launch that armed a node as its condition
// was destroyed left an entry no round ever took, and every round that fired a launch
// took the follow lock for good.
func TestEngineForgetsFollowsOfConditionsItLetGo(t *testing.T) {
	tr := &heldTransport{}
	e, err := NewEngine(tr, protocol.Config{}, false)
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Close() })
	leader, _ := heldOn(t, e, tr)
	follower, _ := heldOn(t, e, tr)
	other, _ := heldOn(t, e, tr)
	driveUntil(t, e, "channels", func() bool {
		e.mu.Lock()
		defer e.mu.Unlock()
		return len(e.byTrigger) == 3
	})

	// A follower destroyed: the engine drops it from the leader's list.
	require.True(t, e.Follow(leader.done, follower.trigger))
	require.True(t, e.Follow(other.done, follower.trigger))
	require.Equal(t, 2, follows(t, e))
	require.NoError(t, follower.Destroy())
	driveUntil(t, e, "follower freed", func() bool { return follower.words.Closed() })
	require.Zero(t, follows(t, e), "the destroyed follower is still armed")

	// A leader destroyed: its completion word never fires.
	require.True(t, e.Follow(leader.done, other.trigger))
	require.NoError(t, leader.Destroy())
	driveUntil(t, e, "leader freed", func() bool { return leader.words.Closed() })
	require.Zero(t, follows(t, e))
	require.False(t, e.Follow(leader.done, other.trigger), "armed on a freed completion word")
	require.Zero(t, follows(t, e))

	// A leader failed for good as its transport closes.
	opErr := fmt.Errorf("receive: %w", ErrCanceled)
	c, op := heldOn(t, e, tr)
	launchHeld(t, e, c, op)
	tr.closing.Store(true)
	op.finish(opErr)
	driveUntil(t, e, "failed for good", func() bool { return c.done.Load() == GraphFailed })
	require.False(t, e.Follow(c.done, other.trigger), "armed on a completion word failed for good")
	require.Zero(t, follows(t, e))
	require.NoError(t, c.Destroy())

	// A closed engine.
	require.NoError(t, e.Close())
	fresh, err := Create(Param{Category: Graph, Backend: backend(t), Graph: wordsOnly{}})
	require.NoError(t, err)
	require.False(t, e.Follow(fresh.done, other.trigger), "armed on a closed engine")
	require.Zero(t, follows(t, e))
	require.NoError(t, fresh.Destroy())
}
