package condition

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/stream"
)

func streamCondition(t *testing.T) (stream.Stream, *Condition) {
	b := backend(t)
	s, err := b.NewStream()
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	c, err := Create(Param{Category: Stream, Backend: b, Stream: s})
	require.NoError(t, err)
	return s, c
}

// retireAsTriggered plays the proxy: it retires each of seqs once the trigger word has
// reached it, first waiting for gate(i) when gate is not nil.
func retireAsTriggered(c *Condition, seqs []uint64, gate func(i int) <-chan struct{}) chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i, seq := range seqs {
			for int64(c.trigger.Load()-seq) < 0 {
				time.Sleep(10 * time.Microsecond)
			}
			if gate != nil {
				select {
				case <-gate(i):
				case <-time.After(5 * time.Second):
					return // the test fails on its own wait
				}
			}
			c.retire(seq, nil)
		}
	}()
	return done
}

func syncWithin(t *testing.T, s stream.Stream, d time.Duration) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- s.Synchronize() }()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(d):
		t.Fatalf("the stream did not finish within %v", d)
	}
}

// Parts with work before their trigger (staged puts) are triggered one by one, each
// right after its own work: part i is triggered before part i+1's work runs.
func TestArmChunksTriggersEachPartAfterItsWork(t *testing.T) {
	s, c := streamCondition(t)
	const parts = 4
	seen := make([]uint64, parts) // the trigger word when part i's work ran
	work := make([]streamWork, parts)
	for i := range work {
		work[i].before = func(s stream.Stream) error {
			return s.LaunchHostFunc(func() { seen[i] = c.trigger.Load() })
		}
	}
	var recorded []uint64
	armed, err := c.armChunks(true, work, func(part int, seq uint64) {
		require.Equal(t, len(recorded), part)
		recorded = append(recorded, seq)
	})
	require.NoError(t, err)
	require.Equal(t, parts, armed)
	require.Equal(t, []uint64{1, 2, 3, 4}, recorded)
	var after bool
	require.NoError(t, s.LaunchHostFunc(func() { after = c.done.Load() == parts }))
	done := retireAsTriggered(c, recorded, nil)
	syncWithin(t, s, 5*time.Second)
	<-done
	require.Equal(t, []uint64{0, 1, 2, 3}, seen)
	require.True(t, after, "work enqueued after the operation ran before its last part completed")
	require.NoError(t, c.Destroy())
}

// Parts with work after their completion (staged gets) start together, and part i's
// work runs as soon as part i completed, while later parts are still in flight: the
// stand-in proxy completes part i+1 only after part i's work ran, which deadlocks
// unless the stream waits part by part.
func TestArmChunksRunsEachPartsWorkAfterItsCompletion(t *testing.T) {
	s, c := streamCondition(t)
	const parts = 3
	ran := make([]chan struct{}, parts)
	done := make([]uint64, parts) // the completion word when part i's work ran
	work := make([]streamWork, parts)
	for i := range work {
		ran[i] = make(chan struct{})
		work[i].after = func(s stream.Stream) error {
			return s.LaunchHostFunc(func() {
				done[i] = c.done.Load()
				close(ran[i])
			})
		}
	}
	var recorded []uint64
	armed, err := c.armChunks(true, work, func(_ int, seq uint64) { recorded = append(recorded, seq) })
	require.NoError(t, err)
	require.Equal(t, parts, armed)
	// One trigger for all parts.
	require.Eventually(t, func() bool { return c.trigger.Load() == parts }, 5*time.Second, time.Millisecond)
	proxy := retireAsTriggered(c, recorded, func(i int) <-chan struct{} {
		if i == 0 {
			return closed()
		}
		return ran[i-1]
	})
	syncWithin(t, s, 5*time.Second)
	<-proxy
	require.Equal(t, []uint64{1, 2, 3}, done)
	require.NoError(t, c.Destroy())
}

func closed() <-chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}

// Without stream-ordered completion nothing waits: the stream runs on with the parts
// still pending.
func TestArmChunksNonBlocking(t *testing.T) {
	s, c := streamCondition(t)
	armed, err := c.armChunks(false, make([]streamWork, 3), func(int, uint64) {})
	require.NoError(t, err)
	require.Equal(t, 3, armed)
	syncWithin(t, s, 5*time.Second)
	require.Equal(t, uint64(3), c.trigger.Load())
	require.Equal(t, 3, c.Pending())
	for seq := uint64(1); seq <= 3; seq++ {
		c.retire(seq, nil)
	}
	require.NoError(t, c.Destroy())
}

func TestArmChunksRefuses(t *testing.T) {
	_, c := streamCondition(t)
	none := func(int, uint64) { t.Fatal("recorded a part of a refused operation") }
	_, err := c.armChunks(true, nil, none)
	require.ErrorIs(t, err, ErrInvalidParam)
	require.NoError(t, c.BeginGroup())
	_, err = c.armChunks(true, make([]streamWork, 2), none)
	require.ErrorIs(t, err, ErrInvalidParam)
	require.NoError(t, c.EndGroup())
	require.NoError(t, c.Destroy())
	_, err = c.armChunks(true, make([]streamWork, 2), none)
	require.ErrorIs(t, err, ErrDestroyed)

	kc, err := Create(Param{Category: KernelTriggered, Backend: backend(t)})
	require.NoError(t, err)
	_, err = kc.armChunks(true, make([]streamWork, 2), none)
	require.ErrorIs(t, err, ErrInvalidParam)
	require.NoError(t, kc.Destroy())
}

// recordingStream counts how the condition enqueues its waits.
type recordingStream struct {
	stream.Stream
	writeThenWait, poll int
}

func (r *recordingStream) WriteThenWait(w *stream.Word, v uint64, on *stream.Word, ov uint64, cmp stream.Compare) error {
	r.writeThenWait++
	return r.Stream.WriteThenWait(w, v, on, ov, cmp)
}

func (r *recordingStream) PollValue(w *stream.Word, v uint64) error {
	r.poll++
	return r.Stream.PollValue(w, v)
}

// An operation that asks to poll for completion (alone or in a group) gets a trigger
// store and a PollValue instead of WriteThenWait, and the stream still waits for it.
func TestPollCompletion(t *testing.T) {
	b := backend(t)
	s, err := b.NewStream()
	require.NoError(t, err)
	defer s.Close()
	rs := &recordingStream{Stream: s}
	c, err := Create(Param{Category: Stream, Backend: b, Stream: rs})
	require.NoError(t, err)

	poll := streamWork{poll: true}
	_, err = c.arm(true, poll, func(uint64) {})
	require.NoError(t, err)
	require.NoError(t, c.BeginGroup())
	_, err = c.arm(true, streamWork{}, func(uint64) {})
	require.NoError(t, err)
	_, err = c.arm(true, poll, func(uint64) {})
	require.NoError(t, err)
	require.NoError(t, c.EndGroup())
	_, err = c.arm(true, streamWork{}, func(uint64) {})
	require.NoError(t, err)
	require.Equal(t, 2, rs.poll)
	require.Equal(t, 1, rs.writeThenWait)

	var ran bool
	require.NoError(t, s.LaunchHostFunc(func() { ran = c.done.Load() == 4 }))
	done := retireAsTriggered(c, []uint64{1, 2, 3, 4}, nil)
	syncWithin(t, s, 5*time.Second)
	<-done
	require.True(t, ran, "work after the operations ran before they completed")
	require.NoError(t, c.Destroy())
}
