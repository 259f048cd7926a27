package bootstrap

import (
	"context"
	"errors"
	"fmt"

	"github.com/ucpx/ucpx/internal/errs"
	"github.com/ucpx/ucpx/ucp"
)

// Errors; test with errors.Is.
var (
	// ErrInvalidParam: a bad argument or environment variable; nothing was done.
	ErrInvalidParam = errs.InvalidParam
	// ErrClosed: the job or server was closed.
	ErrClosed = errs.Closed
	// ErrProtocol: a peer sent bytes that are not the rendezvous protocol.
	ErrProtocol = errs.New("bootstrap: protocol error", errs.InvalidParam)
	// ErrAuth: the other side does not hold the job's key (or this side has none). It
	// is ucp.ErrAuth: one test covers the rendezvous and ucp's wire-up.
	ErrAuth = ucp.ErrAuth
	// ErrNotFound: Get of a key nobody has set.
	ErrNotFound = errs.New("bootstrap: key not found")
	// ErrRankFailed: a rank of the job failed or is gone (see RankError for which); it
	// also matches ucp.ErrPeerFailed.
	ErrRankFailed = errs.New("bootstrap: rank failed", ucp.ErrPeerFailed)
	// ErrRankTaken: another process joined the job as this rank.
	ErrRankTaken = errs.New("bootstrap: rank already joined")
	// ErrStoreFull: the rendezvous store reached its limits.
	ErrStoreFull = errs.New("bootstrap: store full")
	// ErrRendezvousLost: the connection to the rendezvous broke (rank 0 gone).
	ErrRendezvousLost = errs.New("bootstrap: rendezvous lost")
	// ErrTimedOut: a context's deadline ended the wait (the error matches
	// context.DeadlineExceeded and ucp.ErrTimedOut too).
	ErrTimedOut = errs.New("bootstrap: timed out", errs.TimedOut)
	// ErrCanceled: a context was canceled during the wait (the error matches
	// context.Canceled too); it is ucp.ErrCanceled.
	ErrCanceled = errs.Canceled
)

// ctxErr is the error of a wait that ctx ended: ErrTimedOut and
// context.DeadlineExceeded after a deadline, ErrCanceled and context.Canceled after
// a cancel.
func ctxErr(ctx context.Context, what string) error {
	err := ctx.Err()
	if err == nil {
		err = context.Canceled
	}
	kind := ErrCanceled
	if errors.Is(err, context.DeadlineExceeded) {
		kind = ErrTimedOut
	}
	if cause := context.Cause(ctx); cause != nil && cause != err {
		return fmt.Errorf("bootstrap: %s: %w: %w (%v)", what, kind, err, cause)
	}
	return fmt.Errorf("bootstrap: %s: %w: %w", what, kind, err)
}

// RankError names the rank whose failure (or departure) caused an error; it matches
// ErrRankFailed and the underlying error (for an endpoint, ucp.ErrPeerFailed; for a
// barrier that a rank left with Job.Close, ErrClosed).
type RankError struct {
	Rank int
	Err  error
}

func (e *RankError) Error() string { return fmt.Sprintf("rank %d: %v", e.Rank, e.Err) }

func (e *RankError) Unwrap() []error { return []error{e.Err, ErrRankFailed} }
