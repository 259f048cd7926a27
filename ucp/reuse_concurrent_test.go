package ucp

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Two goroutines reusing one caller-owned Request at once (its doc allows one at a
// time): both calls passed checkReuse before either posted, both posts tracked the
// Request, and the second UCX completion completed an unrelated receive, whose data had
// gone to the other goroutine's buffer. Now the call that posts second fails with
// ErrInvalidParam, its receive is canceled, and nothing else is touched.
func TestConcurrentRequestReuseFailsTheSecondCall(t *testing.T) {
	p := newShmPair(t)
	stopA := background(p.a)
	defer stopA()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// Done once first: the check of a done Request reads only its atomics (a zero
	// Request's first use read fields the other call writes: a race report).
	shared := &Request{}
	_, err := p.b.TagRecvNbx(make([]byte, 8), 40, ^uint64(0), &RequestParam{Request: shared})
	require.NoError(t, err)
	require.NoError(t, p.epA.TagSend(ctx, []byte("00000000"), 40))
	require.NoError(t, shared.Wait(ctx))

	overlapped := 0 // both calls passed checkReuse: postLocked refused the second
	for attempt := 0; attempt < 100 && overlapped < 5; attempt++ {
		var wg sync.WaitGroup
		start := make(chan struct{})
		var errs [2]error
		bufs := [2][]byte{make([]byte, 8), make([]byte, 8)}
		for g := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				_, errs[g] = p.b.TagRecvNbx(bufs[g], 40, ^uint64(0), &RequestParam{Request: shared})
			}()
		}
		// The worker is busy (a goroutine progressing holds w.mu): both calls check the
		// Request and queue on w.mu.
		p.b.mu.Lock()
		close(start)
		time.Sleep(time.Millisecond)
		p.b.mu.Unlock()
		wg.Wait()
		require.False(t, errs[0] == nil && errs[1] == nil, "attempt %d: both calls posted on one Request", attempt)
		require.False(t, errs[0] != nil && errs[1] != nil, "attempt %d: both calls failed: %v; %v", attempt, errs[0], errs[1])
		won, lost := 0, 1
		if errs[0] != nil {
			won, lost = 1, 0
		}
		require.ErrorIs(t, errs[lost], ErrInvalidParam)
		if strings.Contains(errs[lost].Error(), "concurrent call") {
			overlapped++
		}
		// The message completes the winner's receive, in its buffer.
		require.NoError(t, p.epA.TagSend(ctx, []byte("AAAAAAAA"), 40))
		require.NoError(t, shared.Wait(ctx))
		require.Equal(t, "AAAAAAAA", string(bufs[won]))
		// An unrelated receive gets the next message, in its own buffer: the loser's
		// receive was canceled and took nothing.
		qbuf := make([]byte, 8)
		q, err := p.b.TagRecvNbx(qbuf, 40, ^uint64(0), nil)
		require.NoError(t, err)
		require.NoError(t, p.epA.TagSend(ctx, []byte("BBBBBBBB"), 40))
		require.NoError(t, q.Wait(ctx))
		require.Equal(t, 8, q.Length())
		require.Equal(t, "BBBBBBBB", string(qbuf))
		require.Equal(t, make([]byte, 8), bufs[lost], "the refused call's buffer was written")
	}
	t.Logf("%d attempts where both calls passed checkReuse", overlapped)
}
