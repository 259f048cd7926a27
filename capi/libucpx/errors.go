package main

/*
#include <string.h>
#include "ucpx.h"
*/
import "C"

import (
	"context"
	"errors"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/ucpx/ucpx/cgo/cuda"
	"github.com/ucpx/ucpx/internal/errs"
	"github.com/ucpx/ucpx/ucp"
)

// errBufferTooSmall: an output string does not fit; *needed says what would.
var errBufferTooSmall = errs.New("output buffer too small", errs.InvalidParam)

// lastErr holds, per OS thread, the message of the last call that failed there. A C
// thread calling into Go runs the call on itself, so its thread id names the caller.
var lastErr = struct {
	sync.Mutex
	m map[int]string
}{m: map[int]string{}}

// status records err for the calling thread and returns its code (UCPX_OK for nil).
func status(err error) C.int {
	if err == nil {
		return C.UCPX_OK
	}
	lastErr.Lock()
	if len(lastErr.m) >= maxErrThreads {
		// Threads come and go (their ids are reused): past this many, the messages of
		// the others are dropped rather than kept for good.
		clear(lastErr.m)
	}
	lastErr.m[unix.Gettid()] = err.Error()
	lastErr.Unlock()
	return code(err)
}

// maxErrThreads bounds the threads whose last error is kept.
const maxErrThreads = 4096

// code maps an error to its ucpx_status; the narrower kinds are tested first.
func code(err error) C.int {
	switch {
	case err == nil:
		return C.UCPX_OK
	case errors.Is(err, errInvalidHandle):
		return C.UCPX_ERR_INVALID_HANDLE
	case errors.Is(err, errBufferTooSmall), errors.Is(err, ucp.ErrBufferTooSmall):
		return C.UCPX_ERR_BUFFER_TOO_SMALL
	case errors.Is(err, ucp.ErrSendIncomplete): // before its cause (a timeout, a failure)
		return C.UCPX_ERR_SEND_INCOMPLETE
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, ucp.ErrTimedOut):
		return C.UCPX_ERR_TIMEOUT
	case errors.Is(err, ucp.ErrMessageTruncated):
		return C.UCPX_ERR_TRUNCATED
	case errors.Is(err, ucp.ErrOutOfRange):
		return C.UCPX_ERR_OUT_OF_RANGE
	case errors.Is(err, ucp.ErrAuth):
		return C.UCPX_ERR_AUTH
	case errors.Is(err, ucp.ErrRevoked):
		return C.UCPX_ERR_REVOKED
	case errors.Is(err, ucp.ErrInvalidAddr):
		return C.UCPX_ERR_INVALID_ADDR
	case errors.Is(err, cuda.ErrNoDriver), errors.Is(err, cuda.ErrNoDevice):
		return C.UCPX_ERR_NO_DEVICE
	case errors.Is(err, ucp.ErrPeerFailed):
		return C.UCPX_ERR_PEER_FAILED
	case errors.Is(err, ucp.ErrCanceled):
		return C.UCPX_ERR_CANCELED
	case errors.Is(err, ucp.ErrClosed):
		return C.UCPX_ERR_CLOSED
	case errors.Is(err, ucp.ErrBusy):
		return C.UCPX_ERR_BUSY
	case errors.Is(err, ucp.ErrUnsupported):
		return C.UCPX_ERR_UNSUPPORTED
	case errors.Is(err, ucp.ErrInvalidParam):
		return C.UCPX_ERR_INVALID_PARAM
	}
	return C.UCPX_ERR_OTHER
}

//export ucpx_last_error
func ucpx_last_error(buf *C.char, n C.size_t) C.size_t {
	lastErr.Lock()
	msg := lastErr.m[unix.Gettid()]
	lastErr.Unlock()
	if buf != nil && n > 0 {
		copyString(buf, msg[:min(uint64(len(msg)), uint64(n)-1)])
	}
	return C.size_t(len(msg))
}

// putString writes s NUL-terminated into buf (n bytes), *needed the size it takes.
func putString(s string, buf *C.char, n C.size_t, needed *C.size_t) error {
	if needed != nil {
		*needed = C.size_t(len(s) + 1)
	}
	if buf == nil || uint64(n) < uint64(len(s))+1 { // unsigned: a length past INT64_MAX is large, not negative
		return errBufferTooSmall
	}
	copyString(buf, s)
	return nil
}

// copyString writes s NUL-terminated at buf, which has room for it.
func copyString(buf *C.char, s string) {
	if len(s) > 0 {
		C.memcpy(unsafe.Pointer(buf), unsafe.Pointer(unsafe.StringData(s)), C.size_t(len(s)))
	}
	*(*C.char)(unsafe.Add(unsafe.Pointer(buf), len(s))) = 0
}
