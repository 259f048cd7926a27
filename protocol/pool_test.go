package protocol

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/stream"
	"github.com/ucpx/ucpx/stream/streamcore"
)

func TestHostBackendNeedsNoStaging(t *testing.T) {
	b := stream.NewHostBackend()
	defer b.Close()
	s := NewPool(b)
	buf := make([]byte, 8)
	kind, err := s.Classify(uintptr(len(buf))) // any address: host backends never stage
	require.NoError(t, err)
	require.Equal(t, KindHost, kind)
	// What it lends (StageAlways only) is mapped host memory.
	m, err := s.Get(100)
	require.NoError(t, err)
	require.Equal(t, minClass, m.Size())
	m.Bytes()[99] = 1
	s.Put(m)
	require.NoError(t, s.Close())
}

func TestSizeClasses(t *testing.T) {
	for _, tc := range []struct{ n, want int }{
		{1, minClass}, {minClass, minClass}, {minClass + 1, 2 * minClass}, {1 << 20, 1 << 20}, {(1 << 20) + 1, 2 << 20},
	} {
		assert.Equal(t, tc.want, class(tc.n), "class(%d)", tc.n)
	}
}

func TestConfigResolve(t *testing.T) {
	c, err := Config{}.Resolve()
	require.NoError(t, err)
	require.Equal(t, DefaultConfig(), c)
	c, err = Config{StagingPart: 1 << 20, RingAfter: time.Microsecond}.Resolve()
	require.NoError(t, err)
	require.Equal(t, 1<<20, c.StagingPart)
	require.Equal(t, time.Microsecond, c.RingAfter)
	require.Equal(t, DefaultPollCompletionBytes, c.PollCompletionBytes)
	for _, bad := range []Config{{StagingPart: -1}, {StagingPart: 1}, {StagingPart: MinStagingPart - 1}, {PollCompletionBytes: -1}, {RingAfter: -1}, {ReserveBuffers: -1}} {
		_, err := bad.Resolve()
		require.ErrorIs(t, err, ErrInvalidParam, "%+v", bad)
	}
}

// On host backends every plan is one part that moves the caller's buffer as is; the
// stream polls for large completions and never rings.
func TestPlanHostBackend(t *testing.T) {
	b := stream.NewHostBackend()
	defer b.Close()
	pl, err := NewPlanner(Config{PollCompletionBytes: 1024}, false)
	require.NoError(t, err)
	defer pl.Close()
	for _, tc := range []struct {
		n       int
		ordered bool
		poll    bool
	}{{8, true, false}, {1024, true, true}, {1 << 20, false, false}} {
		buf := make([]byte, tc.n)
		var plan Plan
		require.NoError(t, pl.Plan(Transfer{Buf: buf, Dir: Out, Splittable: true}, Route{Backend: b, OnStream: true, StreamOrdered: tc.ordered}, &plan))
		require.Len(t, plan.Parts, 1)
		require.False(t, plan.Staged())
		require.Equal(t, &buf[0], &plan.Parts[0].Buf[0])
		require.Equal(t, tc.poll, plan.Poll, "n=%d", tc.n)
		require.False(t, plan.Ring)
	}
	// Device memory declared on a host backend fails at the call, with the reason.
	var plan Plan
	err = pl.Plan(Transfer{Buf: make([]byte, 8), Dir: In, DeclaredDevice: true}, Route{Backend: b, OnStream: true, StreamOrdered: true}, &plan)
	require.ErrorIs(t, err, ErrInvalidParam)
	require.Contains(t, err.Error(), "host-stream backend")
	// With StageOffStream the caller stages it when it is issued: the plan moves it as
	// is, after the hook made what that needs; the hook's failure is the plan's.
	calls := 0
	dev := make([]byte, 8)
	off := Transfer{Buf: dev, Dir: In, DeclaredDevice: true, StageOffStream: func() error { calls++; return nil }}
	require.NoError(t, pl.Plan(off, Route{Backend: b}, &plan))
	require.Equal(t, 1, calls)
	require.False(t, plan.Staged())
	require.Equal(t, &dev[0], &plan.Parts[0].Buf[0])
	off.StageOffStream = func() error { return ErrClosed }
	require.ErrorIs(t, pl.Plan(off, Route{Backend: b}, &plan), ErrClosed)
}

// countPinned is a backend with HostStaging that counts pinned allocations.
type countPinned struct {
	streamcore.Backend
	n *int
}

func (countPinned) Locate(uintptr) (bool, bool, error) { return true, false, nil }
func (c countPinned) AllocPinned(n int) (streamcore.Pinned, error) {
	*c.n++
	return allocHost(n)
}

// Reservations add up (each keeps a buffer Get does not take), a held one lends its
// buffer without an allocation, and one ended (at most once, also while lending) frees
// its buffer for others: the pool does not grow.
func TestReservationsAddUp(t *testing.T) {
	hb := stream.NewHostBackend()
	defer hb.Close()
	allocs := 0
	s := NewPool(countPinned{hb, &allocs})
	var st Stats
	const n = 100 << 10
	var r1, r2, r3 Reservation
	require.NoError(t, s.Hold(&r1, n))
	require.NoError(t, s.Hold(&r2, n))
	require.Equal(t, 2, allocs, "one buffer per reservation")
	require.ErrorIs(t, s.Hold(&r1, n), ErrInvalidParam)
	b, err := s.Get(n)
	require.NoError(t, err)
	require.Equal(t, 3, allocs, "Get takes no reserved buffer")
	s.Put(b)
	_, rel1, err := s.LendReserved(&r1, n, &st)
	require.NoError(t, err)
	_, rel2, err := s.LendReserved(&r2, n, &st)
	require.NoError(t, err)
	require.Equal(t, 3, allocs, "a reservation lends its own buffer")
	r1.Release() // while lending: its buffer comes back later
	r1.Release()
	rel1()
	rel2()
	rel2()
	require.NoError(t, s.Hold(&r3, n))
	require.Equal(t, 3, allocs, "r1's buffer is free again")
	r2.Release()
	r3.Release()
	var got []*Buffer
	for range 3 {
		b, err := s.Get(n)
		require.NoError(t, err)
		got = append(got, b)
	}
	require.Equal(t, 3, allocs, "ended reservations keep nothing")
	require.Equal(t, 3, s.Lent())
	for _, b := range got {
		s.Put(b)
	}
	require.NoError(t, s.Close())
	require.ErrorIs(t, s.Hold(&r3, n), ErrClosed)
}
