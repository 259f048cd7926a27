package condition

import (
	"bytes"
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/ucpx/ucpx/protocol"
	"github.com/ucpx/ucpx/stream"
)

// Staged operations whose stream refuses part of their work: their staging buffers go
// back to the pool, and only once the stream has passed the copies on them.

var errRefused = errors.New("refused by the stream")

// faultyStream is a stream that refuses trigger stores (as a stream whose memops the
// driver refuses) or host functions (cuLaunchHostFunc failing) on demand, and holds
// every copy back until gate holds 1, so a test decides when copies run.
type faultyStream struct {
	stream.Stream
	gate                                                  *stream.Word
	refuseTrigger, refuseHostFunc, refuseCopy, refusePoll atomic.Bool
}

func (f *faultyStream) PollValue(w *stream.Word, v uint64) error {
	if f.refusePoll.Load() {
		return errRefused
	}
	return f.Stream.PollValue(w, v)
}

func (f *faultyStream) WriteValue(w *stream.Word, v uint64) error {
	if f.refuseTrigger.Load() {
		return errRefused
	}
	return f.Stream.WriteValue(w, v)
}

func (f *faultyStream) WriteThenWait(w *stream.Word, v uint64, on *stream.Word, ov uint64, cmp stream.Compare) error {
	if f.refuseTrigger.Load() {
		return errRefused
	}
	return f.Stream.WriteThenWait(w, v, on, ov, cmp)
}

func (f *faultyStream) LaunchHostFunc(fn func()) error {
	if f.refuseHostFunc.Load() {
		return errRefused
	}
	return f.Stream.LaunchHostFunc(fn)
}

func (f *faultyStream) Copy(dst, src uintptr, n int) error {
	if f.refuseCopy.Load() {
		return errRefused
	}
	if err := f.Stream.WaitValue(f.gate, 1, stream.GEQ); err != nil {
		return err
	}
	return f.Stream.Copy(dst, src, n)
}

// open lets the held copies run.
func (f *faultyStream) open() {
	f.gate.Store(1)
	f.gate.Block().Notify()
}

// instant is an operation that completes in its issue call: an outgoing one records
// the bytes it sent (its staging buffer at the issue), an incoming one fills its
// staging buffer with data.
type instant struct {
	data []byte
	sent []byte
}

type instantIssued struct{}

func (instantIssued) Done() bool { return true }
func (instantIssued) Err() error { return nil }
func (instantIssued) Cancel()    {}

func (o *instant) Issue(p *protocol.Part) (Issued, error) {
	if o.data != nil {
		copy(p.Buf, o.data)
	} else {
		o.sent = append([]byte(nil), p.Buf...)
	}
	return instantIssued{}, nil
}

// stagingEngine is an engine staging every buffer (StageAlways), and a host backend.
func stagingEngine(t *testing.T) (*Engine, stream.Backend, *protocol.Planner) {
	b := backend(t)
	e, err := NewEngine(idleTransport{}, protocol.Config{Staging: protocol.StageAlways}, false)
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Close() })
	return e, b, e.planner
}

// faultyCondition is a Stream condition on a faultyStream of b whose copies wait for
// the stream's gate.
func faultyCondition(t *testing.T, b stream.Backend) (*faultyStream, *Condition) {
	s, err := b.NewStream()
	require.NoError(t, err)
	gate, err := b.AllocWords(1)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close(); _ = gate.Close() })
	f := &faultyStream{Stream: s, gate: gate.Word(0)}
	c, err := Create(Param{Category: Stream, Backend: b, Stream: f})
	require.NoError(t, err)
	return f, c
}

// deviceMem is memory outside Go's heap standing for a device buffer (stream copies
// take raw addresses), filled with fill.
func deviceMem(t *testing.T, n int, fill byte) []byte {
	m, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	require.NoError(t, err)
	t.Cleanup(func() { _ = unix.Munmap(m) })
	for i := range m {
		m[i] = fill
	}
	return m
}

func addr(b []byte) uintptr { return uintptr(unsafe.Pointer(&b[0])) }

func waitOp(t *testing.T, o *Op) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, o.Wait(ctx))
}

const stagedBytes = 8 << 10

// A staged receive whose stream refuses the host function that gives its staging
// buffer back after the copy in: the buffer stays lent while that copy has yet to run
// (another operation gets other memory), and goes back once the stream has passed it:
// behind the condition's next operation or, as here, at Destroy. It leaked, one buffer
// per refusal.
func TestStagingOfRefusedGiveBackReturnsAfterTheCopyIn(t *testing.T) {
	e, b, pool := stagingEngine(t)
	f, c := faultyCondition(t, b)
	dev := deviceMem(t, stagedBytes, 0)
	want := bytes.Repeat([]byte{0xcd}, stagedBytes)

	f.refuseHostFunc.Store(true)
	var o Op
	err := e.Submit(&o, c, &instant{data: want}, Submission{What: "recv", Transfer: protocol.Transfer{Buf: dev, Dir: protocol.In}})
	require.ErrorIs(t, err, errRefused)
	require.True(t, o.Submitted(), "the receive is armed: only the give-back was refused")
	waitOp(t, &o)
	held := addr(o.plan.Parts[0].Buf)
	require.Equal(t, 1, pool.Lent(), "the copy in has yet to read the staging buffer")

	// Meanwhile another operation (on a stream of its own) is lent other memory.
	s2, err := b.NewStream()
	require.NoError(t, err)
	defer s2.Close()
	c2, err := Create(Param{Category: Stream, Backend: b, Stream: s2})
	require.NoError(t, err)
	out := deviceMem(t, stagedBytes, 0xee)
	sent := &instant{}
	var o2 Op
	require.NoError(t, e.Submit(&o2, c2, sent, Submission{What: "send", Transfer: protocol.Transfer{Buf: out, Dir: protocol.Out}}))
	require.NotEqual(t, held, addr(o2.plan.Parts[0].Buf), "the held buffer was lent again")
	waitOp(t, &o2)
	require.NoError(t, s2.Synchronize())
	require.True(t, bytes.Equal(out, sent.sent), "the other operation's bytes")
	require.NoError(t, c2.Destroy())

	f.open()
	require.NoError(t, f.Synchronize())
	require.True(t, bytes.Equal(want, dev), "the copy in")
	require.NoError(t, c.Destroy())
	require.Equal(t, 0, pool.Lent(), "the staging buffer never came back")
}

// A group whose trigger the stream refused after the copies into its staging buffers
// were enqueued (the operations then start from the host) gives those buffers back
// only once the stream passed the copies: given back at once, another operation was
// lent one and the late copy overwrote the bytes it sent.
func TestStagingOfRefusedGroupReturnsAfterItsCopies(t *testing.T) {
	e, b, pool := stagingEngine(t)
	f, c := faultyCondition(t, b)
	require.NoError(t, c.BeginGroup())
	var o1 Op
	require.NoError(t, e.Submit(&o1, c, &instant{}, Submission{What: "send", Transfer: protocol.Transfer{Buf: deviceMem(t, stagedBytes, 0xaa), Dir: protocol.Out}}))
	f.refuseTrigger.Store(true)
	require.ErrorIs(t, c.EndGroup(), errRefused)
	waitOp(t, &o1) // started from the host
	require.Equal(t, 1, pool.Lent(), "the copy into the staging buffer has yet to run")

	s2, err := b.NewStream()
	require.NoError(t, err)
	defer s2.Close()
	c2, err := Create(Param{Category: Stream, Backend: b, Stream: s2})
	require.NoError(t, err)
	require.NoError(t, c2.BeginGroup())
	want := bytes.Repeat([]byte{0xbb}, stagedBytes)
	sent := &instant{}
	var o2 Op
	require.NoError(t, e.Submit(&o2, c2, sent, Submission{What: "send", Transfer: protocol.Transfer{Buf: deviceMem(t, stagedBytes, 0xbb), Dir: protocol.Out}}))
	require.NoError(t, s2.Synchronize()) // its copy into staging ran
	f.open()
	require.NoError(t, f.Synchronize()) // the refused group's late copy ran
	require.NoError(t, c2.EndGroup())
	waitOp(t, &o2)
	require.True(t, bytes.Equal(want, sent.sent), "the send carried the refused group's bytes")
	require.NoError(t, s2.Synchronize())
	require.Equal(t, 0, pool.Lent(), "the stream passed the copies: every buffer is back")
	require.NoError(t, c.Destroy())
	require.NoError(t, c2.Destroy())
}

// recv and send submit a staged receive into dev (the operation fills its staging
// buffer with data), and a staged send of src, on c.
func recv(e *Engine, o *Op, c *Condition, dev, data []byte) error {
	return e.Submit(o, c, &instant{data: data}, Submission{What: "recv", Transfer: protocol.Transfer{Buf: dev, Dir: protocol.In}})
}

func send(e *Engine, o *Op, c *Condition, src []byte) (*instant, error) {
	op := &instant{}
	return op, e.Submit(o, c, op, Submission{What: "send", Transfer: protocol.Transfer{Buf: src, Dir: protocol.Out}})
}

// A give-back the stream refused is enqueued again behind the condition's next
// operation: once the stream passed that, the buffer is back, with no Destroy.
func TestStagingOfRefusedGiveBackRetriedBehindTheNextOperation(t *testing.T) {
	e, b, pool := stagingEngine(t)
	f, c := faultyCondition(t, b)
	f.refuseHostFunc.Store(true)
	var o Op
	require.ErrorIs(t, recv(e, &o, c, deviceMem(t, stagedBytes, 0), bytes.Repeat([]byte{1}, stagedBytes)), errRefused)
	waitOp(t, &o)
	f.open()
	require.NoError(t, f.Synchronize())
	require.Equal(t, 1, pool.Lent(), "still refused: held")

	f.refuseHostFunc.Store(false)
	var next Op
	require.NoError(t, e.Submit(&next, c, &instant{}, Submission{What: "flush"}))
	waitOp(t, &next)
	require.NoError(t, f.Synchronize())
	require.Equal(t, 0, pool.Lent(), "the held buffer did not come back behind the next operation")
	require.NoError(t, c.Destroy())
}

// A staged send whose trigger and give-back the stream both refused after the copy into
// its staging buffer was enqueued: the buffer stays lent while the copy has yet to run,
// and goes back once Destroy saw the stream pass it (it was kept for good).
func TestStagingOfRefusedTriggerAndGiveBackReturnsAtDestroy(t *testing.T) {
	e, b, pool := stagingEngine(t)
	f, c := faultyCondition(t, b)
	f.refuseTrigger.Store(true)
	f.refuseHostFunc.Store(true)
	var o Op
	_, err := send(e, &o, c, deviceMem(t, stagedBytes, 0xaa))
	require.ErrorIs(t, err, errRefused)
	require.False(t, o.Submitted())
	require.Equal(t, 1, pool.Lent(), "the copy into the staging buffer has yet to run")
	f.open()
	require.NoError(t, f.Synchronize())
	require.NoError(t, c.Destroy())
	require.Equal(t, 0, pool.Lent(), "the staging buffer never came back")
}

// A refused group whose give-back host function is refused too: its buffers are held
// past the stream's copies and go back at Destroy.
func TestStagingOfRefusedGroupAndGiveBackReturnsAtDestroy(t *testing.T) {
	e, b, pool := stagingEngine(t)
	f, c := faultyCondition(t, b)
	require.NoError(t, c.BeginGroup())
	var o1, o2 Op
	_, err := send(e, &o1, c, deviceMem(t, stagedBytes, 0xaa))
	require.NoError(t, err)
	require.NoError(t, recv(e, &o2, c, deviceMem(t, stagedBytes, 0), bytes.Repeat([]byte{1}, stagedBytes)))
	f.refuseTrigger.Store(true)
	f.refuseHostFunc.Store(true)
	require.ErrorIs(t, c.EndGroup(), errRefused)
	waitOp(t, &o1)
	waitOp(t, &o2)
	f.open()
	require.NoError(t, f.Synchronize())
	require.Equal(t, 2, pool.Lent(), "held: nothing told the condition the stream passed")
	require.NoError(t, c.Destroy())
	require.Equal(t, 0, pool.Lent(), "the group's staging buffers never came back")
}

// A staged receive in a group whose trigger the stream refused never gets its copy in
// enqueued: its buffer goes back all the same (it leaked).
func TestStagingOfRefusedGroupReceiveReturns(t *testing.T) {
	e, b, pool := stagingEngine(t)
	f, c := faultyCondition(t, b)
	require.NoError(t, c.BeginGroup())
	var o Op
	require.NoError(t, recv(e, &o, c, deviceMem(t, stagedBytes, 0), bytes.Repeat([]byte{1}, stagedBytes)))
	f.refuseTrigger.Store(true)
	require.ErrorIs(t, c.EndGroup(), errRefused)
	waitOp(t, &o)
	require.NoError(t, f.Synchronize())
	require.Equal(t, 0, pool.Lent(), "the receive's staging buffer never came back")
	require.NoError(t, c.Destroy())
}

// A staged receive whose completion wait or copy in the stream refused after its
// trigger: it runs, and its buffer goes back once it completed (it leaked).
func TestStagingOfReceiveWithoutCopyInReturns(t *testing.T) {
	for _, refuse := range []string{"poll", "copy"} {
		t.Run(refuse, func(t *testing.T) {
			e, b, pool := stagingEngine(t)
			f, c := faultyCondition(t, b)
			f.open()
			n := stagedBytes
			if refuse == "poll" {
				f.refusePoll.Store(true)
				n = protocol.DefaultPollCompletionBytes // waits with PollValue
			} else {
				f.refuseCopy.Store(true)
			}
			var o Op
			require.ErrorIs(t, recv(e, &o, c, deviceMem(t, n, 0), bytes.Repeat([]byte{1}, n)), errRefused)
			require.True(t, o.Submitted())
			waitOp(t, &o)
			require.NoError(t, f.Synchronize())
			require.Equal(t, 0, pool.Lent(), "the receive's staging buffer never came back")
			require.NoError(t, c.Destroy())
		})
	}
}

// A group left open when its engine closed (its operations ended unissued) gives its
// staging back at Destroy, once the stream passed the copies into it.
func TestStagingOfOpenGroupReturnsAtDestroy(t *testing.T) {
	e, b, pool := stagingEngine(t)
	f, c := faultyCondition(t, b)
	require.NoError(t, c.BeginGroup())
	var o Op
	_, err := send(e, &o, c, deviceMem(t, stagedBytes, 0xaa))
	require.NoError(t, err)
	require.NoError(t, e.Close())
	require.ErrorIs(t, o.Err(), ErrCanceled)
	require.Equal(t, 1, pool.Lent(), "the copy into the staging buffer has yet to run")
	f.open()
	require.NoError(t, c.Destroy())
	require.NoError(t, f.Synchronize())
	require.Equal(t, 0, pool.Lent(), "the open group's staging buffer never came back")
	require.ErrorIs(t, c.EndGroup(), ErrDestroyed)
}
