package protocol

import (
	"bytes"
	"hash/crc32"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/stream"
	"github.com/ucpx/ucpx/stream/streamcore"
)

func TestStagingPolicyResolve(t *testing.T) {
	require.Equal(t, StageWhenNeeded, StageDefault.Or(StageDefault))
	require.Equal(t, StageAlways, StageDefault.Or(StageAlways))
	require.Equal(t, StageNever, StageNever.Or(StageAlways))
	require.Equal(t, "PreferPull", PreferPull.String())
	_, err := Config{Staging: PreferPull + 1}.Resolve()
	require.ErrorIs(t, err, ErrInvalidParam)
	_, err = NewWorkspace(nil, MinWorkspace-1)
	require.ErrorIs(t, err, ErrInvalidParam)
}

// A CPU lender finding its slots in use waits (running idle) until they are given
// back, and the stats count the wait and the high-water mark.
func TestWorkspaceLendHostBackPressure(t *testing.T) {
	ws, err := NewWorkspace(nil, MinWorkspace)
	require.NoError(t, err)
	defer ws.Close()
	var st Stats
	slot := ws.SlotSize()
	var rel []func()
	for range WorkspaceSlots {
		mem, release, err := LendHost(ws, nil, slot, Out, &st, func() error { t.Fatal("no wait expected"); return nil })
		require.NoError(t, err)
		require.Len(t, mem, slot)
		rel = append(rel, release)
	}
	// The incoming half is separate: no wait.
	_, releaseIn, err := LendHost(ws, nil, 10, In, &st, func() error { t.Fatal("no wait expected"); return nil })
	require.NoError(t, err)
	idles := 0
	mem, release, err := LendHost(ws, nil, 100, Out, &st, func() error {
		idles++
		if idles == 3 {
			rel[0]()
		}
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, 3, idles)
	require.Len(t, mem, 100)
	s := st.Snapshot()
	require.EqualValues(t, 1, s.Waits)
	require.EqualValues(t, WorkspaceSlots+2, s.Parts)
	require.EqualValues(t, (WorkspaceSlots+1)*slot, s.HighWater, "slots busy at once, the waiting one not counted twice")
	release()
	release() // once
	releaseIn()
	for _, r := range rel[1:] {
		r()
	}
	// A message larger than a half gets memory of its own from the pool.
	pool := NewPool(nil)
	defer pool.Close()
	big, releaseBig, err := LendHost(ws, pool, WorkspaceSlots*slot+1, In, &st, nil)
	require.NoError(t, err)
	require.Len(t, big, WorkspaceSlots*slot+1)
	releaseBig()
	require.EqualValues(t, 1, st.Snapshot().Oversize)
	require.Zero(t, pool.Lent())
}

// fakeCUDA is a host backend that claims to be CUDA and that every buffer is device
// memory: the planner's decisions for device buffers, without a GPU.
type fakeCUDA struct{ streamcore.Backend }

func (fakeCUDA) Kind() streamcore.Kind { return streamcore.KindCUDA }
func (fakeCUDA) Locate(uintptr) (bool, bool, error) {
	return true, false, nil
}
func (fakeCUDA) AllocPinned(n int) (streamcore.Pinned, error) { return allocHost(n) }

func TestStageNeverRefusesAtTheCall(t *testing.T) {
	hb := stream.NewHostBackend()
	defer hb.Close()
	b := fakeCUDA{hb}
	route := Route{Backend: b, OnStream: true, StreamOrdered: true, What: "stream condition"}
	pl, err := NewPlanner(Config{Staging: StageNever, ReserveBuffers: 1}, false)
	require.NoError(t, err)
	defer pl.Close()
	var plan Plan
	err = pl.Plan(Transfer{Buf: make([]byte, 64), Dir: Out}, route, &plan)
	require.ErrorIs(t, err, ErrUnsupported)
	require.Contains(t, err.Error(), "StageNever")
	// Per operation, the policy wins over the context's: staged.
	require.NoError(t, pl.Plan(Transfer{Buf: make([]byte, 64), Dir: Out, Staging: StageWhenNeeded}, route, &plan))
	require.True(t, plan.Staged())
	plan.Unused(0)
	// A transport with CUDA support is a direct path: StageNever moves it as is.
	direct, err := NewPlanner(Config{Staging: StageNever}, true)
	require.NoError(t, err)
	defer direct.Close()
	require.NoError(t, direct.Plan(Transfer{Buf: make([]byte, 64), Dir: Out}, route, &plan))
	require.False(t, plan.Staged())
	// ... and StageAlways stages it all the same.
	require.NoError(t, direct.Plan(Transfer{Buf: make([]byte, 64), Dir: Out, Staging: StageAlways}, route, &plan))
	require.True(t, plan.Staged())
	plan.Unused(0)
}

// runPlan plays the engine for a staged plan (Out: the "transport" copies each part's
// staging buffer into peer at its offset; In: it fills the staging buffer from peer),
// on a host stream, one part at a time as triggers come, then the work after.
func runPlan(t *testing.T, s streamcore.Stream, plan *Plan, dir Direction, peer []byte) {
	t.Helper()
	for i := range plan.Parts {
		p := &plan.Parts[i]
		require.True(t, p.Staged)
		if p.Before != nil {
			require.NoError(t, p.Before(s))
		}
		require.NoError(t, s.Synchronize()) // the trigger
		if dir == Out {
			copy(peer[p.Offset:], p.Buf)
		} else {
			copy(p.Buf, peer[p.Offset:p.Offset+len(p.Buf)])
		}
		if p.Release != nil {
			p.Release()
		}
	}
	for i := range plan.Parts {
		if a := plan.Parts[i].After; a != nil {
			require.NoError(t, a(s))
		}
	}
	require.NoError(t, s.Synchronize())
}

// hostWorkspacePlanner returns a host backend, a workspace of MinWorkspace on it, a
// StageAlways planner through it counting into st, and a stream-ordered route on the
// backend, closed when the test ends.
func hostWorkspacePlanner(t *testing.T, st *Stats) (stream.Backend, *Workspace, *Planner, Route) {
	t.Helper()
	b := stream.NewHostBackend()
	t.Cleanup(func() { _ = b.Close() })
	ws, err := NewWorkspace(b, MinWorkspace)
	require.NoError(t, err)
	t.Cleanup(func() { _ = ws.Close() })
	pl, err := NewPlanner(Config{Staging: StageAlways, Workspace: ws, Stats: st}, false)
	require.NoError(t, err)
	t.Cleanup(func() { _ = pl.Close() })
	return b, ws, pl, Route{Backend: b, OnStream: true, StreamOrdered: true}
}

// StageAlways on a host stream through a small workspace: an RMA larger than the
// workspace streams through it in slot-sized parts, reusing slots (the stream waits),
// in both directions, with the bytes intact; a message that fits takes consecutive
// slots; the workspace is whole again afterwards.
func TestStageAlwaysThroughWorkspaceOnHostStream(t *testing.T) {
	var st Stats
	b, ws, pl, route := hostWorkspacePlanner(t, &st)
	s, err := b.NewStream()
	require.NoError(t, err)
	defer s.Close()
	slot := ws.SlotSize()
	for _, tc := range []struct {
		n          int
		splittable bool
		parts      int
	}{
		{100, false, 1},
		{3*slot + 5, false, 1},
		{3*slot + 5, true, 4},
		{11*slot + 7, true, 12}, // three times round the ring
	} {
		for _, dir := range []Direction{Out, In} {
			src := make([]byte, tc.n)
			for i := range src {
				src[i] = byte(rand.Uint32())
			}
			dst := make([]byte, tc.n)
			user, peer := src, dst // Out: the user's buffer is read
			if dir == In {
				user, peer = dst, src
			}
			var plan Plan
			require.NoError(t, pl.Plan(Transfer{Buf: user, Dir: dir, Splittable: tc.splittable}, route, &plan))
			require.Len(t, plan.Parts, tc.parts, "n=%d", tc.n)
			runPlan(t, s, &plan, dir, peer)
			if dir == Out {
				require.Equal(t, crc32.ChecksumIEEE(src), crc32.ChecksumIEEE(dst), "n=%d out", tc.n)
			} else {
				require.True(t, bytes.Equal(src, dst), "n=%d in", tc.n)
			}
		}
	}
	snap := st.Snapshot()
	require.EqualValues(t, 2*(1+1+4+12), snap.Parts)
	require.EqualValues(t, 2*(100+2*(3*slot+5)+11*slot+7), snap.Bytes)
	require.GreaterOrEqual(t, snap.Waits, uint64(2*8), "the 12-part RMA reuses 8 slots in each direction")
	require.LessOrEqual(t, snap.HighWater, uint64(ws.Size()))
	require.Zero(t, st.inUse.Load(), "every slot given back")
	for h := range 2 {
		for i := range WorkspaceSlots {
			sl := ws.rings[h].slots[i]
			require.Equal(t, sl.uses, sl.freed, "half %d slot %d", h, i)
		}
	}
}

// Parts that never run give their slots back, so later operations do not wait forever.
func TestWorkspaceUnusedPartsFreeSlots(t *testing.T) {
	_, ws, pl, route := hostWorkspacePlanner(t, nil)
	for _, dir := range []Direction{Out, In} {
		var plan Plan
		require.NoError(t, pl.Plan(Transfer{Buf: make([]byte, 9*ws.SlotSize()), Dir: dir, Splittable: true}, route, &plan))
		plan.Unused(0)
		mem, release, err := LendHost(ws, nil, ws.SlotSize(), dir, nil, func() error { t.Fatal("a slot is still held"); return nil })
		require.NoError(t, err)
		require.Len(t, mem, ws.SlotSize())
		release()
	}
}

// A part whose slots are still in use by an operation enqueued on the same stream (it
// may sit in an open group whose trigger comes later) or not enqueued yet moves
// through pool memory of its own instead of waiting; one enqueued on another stream is
// waited for on the stream.
func TestWorkspaceWaitsOnlyAcrossStreams(t *testing.T) {
	var st Stats
	b, ws, pl, route := hostWorkspacePlanner(t, &st)
	s1, err := b.NewStream()
	require.NoError(t, err)
	defer s1.Close()
	s2, err := b.NewStream()
	require.NoError(t, err)
	defer s2.Close()
	half := WorkspaceSlots * ws.SlotSize()
	// first holds the whole outgoing half, enqueued on s1 and never completed yet.
	var first Plan
	require.NoError(t, pl.Plan(Transfer{Buf: make([]byte, half), Dir: Out}, route, &first))
	require.NoError(t, first.Parts[0].Before(s1))
	require.NoError(t, s1.Synchronize())

	// Same stream: no wait, pool memory.
	src := randomBytes(100)
	var same Plan
	require.NoError(t, pl.Plan(Transfer{Buf: src, Dir: Out}, route, &same))
	require.NoError(t, same.Parts[0].Before(s1))
	require.Zero(t, st.Snapshot().Waits, "moved aside: no wait")
	require.NoError(t, s1.Synchronize())
	require.Equal(t, src, same.Parts[0].Buf, "copied into its own memory")
	require.EqualValues(t, 1, st.Snapshot().Oversize)
	same.Parts[0].Release()
	// An operation without a stream never blocks on stream work either.
	pool := NewPool(nil)
	defer pool.Close()
	mem, release, err := LendHost(ws, pool, 100, Out, &st, func() error { t.Fatal("blocked on stream work"); return nil })
	require.NoError(t, err)
	require.Len(t, mem, 100)
	require.EqualValues(t, 1, pool.Lent(), "its own memory")
	release()
	require.EqualValues(t, 2, st.Snapshot().Oversize)

	// Another stream: the stream waits until first is given back.
	var other Plan
	require.NoError(t, pl.Plan(Transfer{Buf: src, Dir: Out}, route, &other))
	require.NoError(t, other.Parts[0].Before(s2))
	done, err := s2.Query()
	require.NoError(t, err)
	require.False(t, done, "s2 waits for the slot")
	require.EqualValues(t, 1, st.Snapshot().Waits)
	require.EqualValues(t, 2, st.Snapshot().Oversize)
	first.Parts[0].Release()
	require.NoError(t, s2.Synchronize())
	require.Equal(t, src, other.Parts[0].Buf)
	other.Parts[0].Release()

	// A get larger than the workspace while an earlier get on the same stream holds
	// the incoming half: every part moves aside, and the bytes arrive.
	var held Plan
	require.NoError(t, pl.Plan(Transfer{Buf: make([]byte, half), Dir: In}, route, &held))
	require.NoError(t, held.Parts[0].Before(s1))
	before := st.Snapshot().Oversize
	peer := randomBytes(9*ws.SlotSize() + 3)
	user := make([]byte, len(peer))
	var big Plan
	require.NoError(t, pl.Plan(Transfer{Buf: user, Dir: In, Splittable: true}, route, &big))
	require.Len(t, big.Parts, 10)
	runPlan(t, s1, &big, In, peer)
	require.Equal(t, peer, user)
	require.Equal(t, before+10, st.Snapshot().Oversize)
	held.Unused(0)
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rand.Uint32())
	}
	return b
}

// A receive a pull may fill in place (PullableIn) is staged at the issue where it
// would be staged on the stream: the plan moves it as is and StageOffStream runs;
// under StageAlways, and without PullableIn, it is staged on the stream.
func TestPullableReceiveStagedAtIssue(t *testing.T) {
	hb := stream.NewHostBackend()
	defer hb.Close()
	route := Route{Backend: fakeCUDA{hb}, OnStream: true, StreamOrdered: true, What: "stream condition"}
	pl, err := NewPlanner(Config{ReserveBuffers: 1}, false)
	require.NoError(t, err)
	defer pl.Close()
	calls := 0
	in := Transfer{Buf: make([]byte, 8192), Dir: In, DeclaredDevice: true, PullableIn: true, StageOffStream: func() error { calls++; return nil }}
	var plan Plan
	require.NoError(t, pl.Plan(in, route, &plan))
	require.False(t, plan.Staged(), "moved as is: the issue stages it")
	require.Equal(t, 1, calls)

	in.Staging = StageAlways
	require.NoError(t, pl.Plan(in, route, &plan))
	require.True(t, plan.Staged(), "StageAlways: staged on the stream")
	plan.Unused(0)

	in.Staging, in.PullableIn = StageWhenNeeded, false
	require.NoError(t, pl.Plan(in, route, &plan))
	require.True(t, plan.Staged(), "not pullable: staged on the stream")
	plan.Unused(0)
	require.Equal(t, 1, calls)
}
