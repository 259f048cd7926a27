// Package errs holds the error roots every ucpx package shares, so that one sentinel
// matches whichever package found the problem: errors.Is(err, ucp.ErrInvalidParam)
// holds for a bad argument found by condition, stream, graph or protocol too, and
// every not-supported error also matches errors.ErrUnsupported.
package errs

import "errors"

// Kind is a sentinel error that may stand for broader ones: errors.Is(k, p) holds
// for each of its parents p (and their parents).
type Kind struct {
	msg     string
	parents []error
}

// New makes a sentinel with message msg that also matches parents.
func New(msg string, parents ...error) *Kind { return &Kind{msg: msg, parents: parents} }

func (k *Kind) Error() string { return k.msg }

// Is reports whether target is one of k's parents, directly or through theirs.
func (k *Kind) Is(target error) bool {
	for _, p := range k.parents {
		if p == target || errors.Is(p, target) {
			return true
		}
	}
	return false
}

// The shared roots. Packages export them under their own names (ucp.ErrInvalidParam,
// stream.ErrInvalidArgument, ...), or derive narrower ones with New.
var (
	// InvalidParam: an argument is out of range, of the wrong kind, or contradicts
	// another; nothing was done.
	InvalidParam = New("invalid parameter")
	// Closed: the object (context, worker, endpoint, stream, condition, ...) was
	// closed or destroyed.
	Closed = New("use of closed object")
	// Unsupported: this build, backend, transport or device lacks the feature.
	Unsupported = New("not supported", errors.ErrUnsupported)
	// Busy: the object still has work in flight; nothing was changed.
	Busy = New("busy")
	// Canceled: the operation was canceled (by the caller, or because its worker closed).
	Canceled = New("canceled")
	// TimedOut: a bound on the time an operation or a wait may take ran out.
	TimedOut = New("timed out")
)
