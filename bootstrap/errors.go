package bootstrap

import (
	"fmt"

	"github.com/ucpx/ucpx/internal/errs"
)

// Errors; test with errors.Is.
var (
	// ErrInvalidParam: a bad argument or environment variable; nothing was done.
	ErrInvalidParam = errs.InvalidParam
	// ErrClosed: the job or server was closed.
	ErrClosed = errs.Closed
	// ErrProtocol: a peer sent bytes that are not the rendezvous protocol.
	ErrProtocol = errs.New("bootstrap: protocol error", errs.InvalidParam)
	// ErrAuth: the other side does not hold the job's key (or this side has none).
	ErrAuth = errs.New("bootstrap: authentication failed")
	// ErrNotFound: Get of a key nobody has set.
	ErrNotFound = errs.New("bootstrap: key not found")
	// ErrRankFailed: a rank of the job failed (see RankError for which).
	ErrRankFailed = errs.New("bootstrap: rank failed")
	// ErrRankTaken: another process joined the job as this rank.
	ErrRankTaken = errs.New("bootstrap: rank already joined")
	// ErrStoreFull: the rendezvous store reached its limits.
	ErrStoreFull = errs.New("bootstrap: store full")
	// ErrRendezvousLost: the connection to the rendezvous broke (rank 0 gone).
	ErrRendezvousLost = errs.New("bootstrap: rendezvous lost")
	// ErrTimedOut: a context ended the wait.
	ErrTimedOut = errs.New("bootstrap: timed out", errs.TimedOut)
)

// RankError names the rank whose failure caused an error; it matches ErrRankFailed
// and the underlying error (for an endpoint, ucp.ErrPeerFailed).
type RankError struct {
	Rank int
	Err  error
}

func (e *RankError) Error() string { return fmt.Sprintf("rank %d: %v", e.Rank, e.Err) }

func (e *RankError) Unwrap() []error { return []error{e.Err, ErrRankFailed} }
