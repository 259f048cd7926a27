package ucp

import (
	"errors"
	"fmt"

	"github.com/ucpx/ucpx/cgo/ucx"
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
	ErrInvalidParam     error = Status(ucx.ErrInvalidParam)
	ErrUnreachable      error = Status(ucx.ErrUnreachable)
	ErrInvalidAddr      error = Status(ucx.ErrInvalidAddr)
	ErrNotImplemented   error = Status(ucx.ErrNotImplemented)
	ErrMessageTruncated error = Status(ucx.ErrMessageTruncated)
	ErrNoProgress       error = Status(ucx.ErrNoProgress)
	ErrBufferTooSmall   error = Status(ucx.ErrBufferTooSmall)
	ErrNoElem           error = Status(ucx.ErrNoElem)
	ErrNoDevice         error = Status(ucx.ErrNoDevice)
	ErrBusy             error = Status(ucx.ErrBusy)
	ErrCanceled         error = Status(ucx.ErrCanceled)
	ErrAlreadyExists    error = Status(ucx.ErrAlreadyExists)
	ErrOutOfRange       error = Status(ucx.ErrOutOfRange)
	ErrTimedOut         error = Status(ucx.ErrTimedOut)
	ErrExceedsLimit     error = Status(ucx.ErrExceedsLimit)
	ErrUnsupported      error = Status(ucx.ErrUnsupported)
	ErrRejected         error = Status(ucx.ErrRejected)
	ErrNotConnected     error = Status(ucx.ErrNotConnected)
	ErrConnectionReset  error = Status(ucx.ErrConnectionReset)
	ErrEndpointTimeout  error = Status(ucx.ErrEndpointTimeout)
)

// ErrClosed is returned for operations on a closed context, worker, endpoint,
// listener, memory handle or rkey. It is not a UCX status: UCX would crash instead.
var ErrClosed = errors.New("ucp: use of closed object")

// ErrPeerFailed is matched (errors.Is) by every error that reports a failed peer:
// the link and endpoint failure ranges of UCX, connection reset, unreachable,
// endpoint timeout. A receive whose RequestParam.Peer fails completes with it too.
var ErrPeerFailed = errors.New("ucp: peer failed")

// Is lets errors.Is(err, ErrPeerFailed) match every peer-failure status.
func (s Status) Is(target error) bool {
	if target == ErrPeerFailed {
		return s.peerFailure()
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
