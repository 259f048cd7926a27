package ucp

import (
	"errors"
	"fmt"

	"github.com/ucpx/ucpx/cgo/ucx"
	"github.com/ucpx/ucpx/internal/errs"
)

// Status is a UCX status code (ucs_status_t) used as an error. Every UCS error status
// maps to one; the common ones have named sentinels below for errors.Is.
type Status int32

func (s Status) Error() string { return "ucx: " + ucx.Status(s).String() }

// Sentinel errors. Operations return them wrapped in *OpError with the operation's
// detail; test with errors.Is(err, ucp.ErrCanceled).
var (
	ErrNoMessage        error = Status(ucx.ErrNoMessage)
	ErrNoResource       error = Status(ucx.ErrNoResource)
	ErrIO               error = Status(ucx.ErrIOError)
	ErrNoMemory         error = Status(ucx.ErrNoMemory)
	ErrUnreachable      error = Status(ucx.ErrUnreachable)
	ErrInvalidAddr      error = Status(ucx.ErrInvalidAddr)
	ErrNotImplemented   error = Status(ucx.ErrNotImplemented)
	ErrMessageTruncated error = Status(ucx.ErrMessageTruncated)
	ErrNoProgress       error = Status(ucx.ErrNoProgress)
	ErrBufferTooSmall   error = Status(ucx.ErrBufferTooSmall)
	ErrNoElem           error = Status(ucx.ErrNoElem)
	ErrNoDevice         error = Status(ucx.ErrNoDevice)
	ErrAlreadyExists    error = Status(ucx.ErrAlreadyExists)
	ErrOutOfRange       error = Status(ucx.ErrOutOfRange)
	ErrExceedsLimit     error = Status(ucx.ErrExceedsLimit)
	ErrRejected         error = Status(ucx.ErrRejected)
	ErrNotConnected     error = Status(ucx.ErrNotConnected)
	ErrConnectionReset  error = Status(ucx.ErrConnectionReset)
	ErrEndpointTimeout  error = Status(ucx.ErrEndpointTimeout)
)

// The roots shared by every ucpx package (internal/errs): an error matches them
// whichever package found it, and a UCX status of the same meaning matches them too.
var (
	// ErrInvalidParam: a bad argument, found by ucpx before UCX (or UCS_ERR_INVALID_PARAM).
	ErrInvalidParam = errs.InvalidParam
	// ErrUnsupported: not available here (UCS_ERR_UNSUPPORTED, UCS_ERR_NOT_IMPLEMENTED,
	// or a combination ucpx cannot run); it also matches errors.ErrUnsupported.
	ErrUnsupported = errs.Unsupported
	// ErrBusy: the object still has work in flight (UCS_ERR_BUSY).
	ErrBusy = errs.Busy
	// ErrCanceled: the operation was canceled (UCS_ERR_CANCELED), by Cancel or because
	// its worker closed.
	ErrCanceled = errs.Canceled
	// ErrTimedOut: a time bound ran out (UCS_ERR_TIMED_OUT; condition.Param.Timeout, a
	// revocation or a close that was not acknowledged in time, a bootstrap wait).
	ErrTimedOut = errs.TimedOut
	// ErrClosed is returned for operations on a closed context, worker, endpoint,
	// listener, memory handle, rkey, condition or stream. It is not a UCX status: UCX
	// would crash instead.
	ErrClosed = errs.Closed
)

// ErrPeerFailed is matched (errors.Is) by every error that reports a failed peer:
// the link and endpoint failure ranges of UCX, connection reset, unreachable,
// endpoint timeout. A receive whose RequestParam.Peer fails completes with it too.
var ErrPeerFailed = errors.New("ucp: peer failed")

// Is lets errors.Is(err, ErrPeerFailed) match every peer-failure status, and the
// statuses that mean a shared root match it.
func (s Status) Is(target error) bool {
	switch target {
	case ErrPeerFailed:
		return s.peerFailure()
	case errs.InvalidParam:
		return ucx.Status(s) == ucx.ErrInvalidParam
	case errs.Unsupported, errors.ErrUnsupported:
		return ucx.Status(s) == ucx.ErrUnsupported || ucx.Status(s) == ucx.ErrNotImplemented
	case errs.Busy:
		return ucx.Status(s) == ucx.ErrBusy
	case errs.Canceled:
		return ucx.Status(s) == ucx.ErrCanceled
	case errs.TimedOut:
		return ucx.Status(s) == ucx.ErrTimedOut
	}
	return false
}

func (s Status) peerFailure() bool {
	st := ucx.Status(s)
	switch {
	case st == ucx.ErrConnectionReset, st == ucx.ErrUnreachable, st == ucx.ErrEndpointTimeout,
		st == ucx.ErrNotConnected, st == ucx.ErrRejected, st == ucx.ErrIOError:
		return true
	case st <= ucx.ErrFirstLinkFailure && st >= ucx.ErrLastEPFailure:
		return true
	}
	return false
}

// OpError wraps an error with the operation that met it.
type OpError struct {
	Op     string // "tag_send_nbx", "worker_create", ...
	Detail string // extra context: sizes, tags, addresses
	Err    error
}

func (e *OpError) Error() string {
	if e.Detail == "" {
		return fmt.Sprintf("ucp: %s: %v", e.Op, e.Err)
	}
	return fmt.Sprintf("ucp: %s (%s): %v", e.Op, e.Detail, e.Err)
}

func (e *OpError) Unwrap() error { return e.Err }

// statusErr converts a UCX status into nil or an error value.
func statusErr(st ucx.Status) error {
	if st == ucx.OK {
		return nil
	}
	return Status(st)
}

func opErr(op string, err error, detail string, args ...any) error {
	if err == nil {
		return nil
	}
	if len(args) > 0 {
		detail = fmt.Sprintf(detail, args...)
	}
	return &OpError{Op: op, Detail: detail, Err: err}
}
