package cuda

/*
#include "shim.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/ucpx/ucpx/internal/errs"
)

// Result is a CUresult, the status code every driver call returns.
type Result uint32

// String returns the CUDA name of the code ("CUDA_ERROR_INVALID_VALUE"), from
// the loaded driver when there is one, else from a table built into ucpx.
func (r Result) String() string {
	if driverLoaded.Load() {
		if s := C.ucpx_error_name(C.CUresult(r)); s != nil {
			return C.GoString(s)
		}
	}
	if s, ok := resultNames[r]; ok {
		return s
	}
	return "CUDA_ERROR(" + strconv.FormatUint(uint64(r), 10) + ")"
}

// Description is the driver's one-line explanation of the code, or "" where no
// driver is loaded.
func (r Result) Description() string {
	if !driverLoaded.Load() {
		return ""
	}
	if s := C.ucpx_error_string(C.CUresult(r)); s != nil {
		return C.GoString(s)
	}
	return ""
}

// Error is a failed driver call. It matches (errors.Is) any *Error with the same
// Code, so the sentinels below work whatever the operation:
//
//	if errors.Is(err, cuda.ErrNotReady) { ... }
type Error struct {
	Code   Result
	Name   string // CUDA name of Code, e.g. "CUDA_ERROR_INVALID_PTX"
	Op     string // the driver entry point (or ucpx operation) that failed; "" for sentinels
	Detail string // extra context: the JIT log of a failed module load, a missing symbol
	// closed: the Go side found the object closed (closedErr), not the driver; such an
	// error is "closed" too.
	closed bool
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("cuda: ")
	if e.Op != "" {
		b.WriteString(e.Op)
		b.WriteString(": ")
	}
	b.WriteString(e.Name)
	if d := e.Code.Description(); d != "" && e.Op != "" {
		b.WriteString(" (")
		b.WriteString(d)
		b.WriteString(")")
	}
	if e.Detail != "" {
		b.WriteString(": ")
		b.WriteString(e.Detail)
	}
	return b.String()
}

// Is reports whether target is an *Error with the same code.
// Is matches the sentinel of the same code, and the roots every ucpx package shares:
// CUDA_ERROR_NOT_SUPPORTED (and a missing entry point) is "not supported" (matching
// errors.ErrUnsupported too), CUDA_ERROR_INVALID_VALUE is "invalid parameter", and the
// use of an object after Close (ErrInvalidHandle, found before any driver call) is
// "closed" (ucp.ErrClosed, graph.ErrClosed, ...). A CUDA_ERROR_INVALID_HANDLE from the
// driver itself is not "closed": the driver does not say why.
func (e *Error) Is(target error) bool {
	switch target {
	case errs.Unsupported, errors.ErrUnsupported:
		return e.Code == ErrNotSupported.Code
	case errs.InvalidParam:
		return e.Code == ErrInvalidValue.Code
	case errs.Closed:
		return e.closed
	}
	t, ok := target.(*Error)
	return ok && t.Code == e.Code
}

func sentinel(code Result) *Error { return &Error{Code: code, Name: resultNames[code]} }

// Sentinels for the driver codes callers most often branch on. Compare with
// errors.Is; errors returned by this package carry Op and Detail as well.
var (
	ErrInvalidValue           = sentinel(1)   // CUDA_ERROR_INVALID_VALUE; also Go-side argument checks
	ErrOutOfMemory            = sentinel(2)   // CUDA_ERROR_OUT_OF_MEMORY
	ErrNotInitialized         = sentinel(3)   // CUDA_ERROR_NOT_INITIALIZED
	ErrDeinitialized          = sentinel(4)   // CUDA_ERROR_DEINITIALIZED
	ErrStubLibrary            = sentinel(34)  // CUDA_ERROR_STUB_LIBRARY
	ErrNoDevice               = sentinel(100) // CUDA_ERROR_NO_DEVICE
	ErrInvalidDevice          = sentinel(101) // CUDA_ERROR_INVALID_DEVICE
	ErrInvalidImage           = sentinel(200) // CUDA_ERROR_INVALID_IMAGE
	ErrInvalidContext         = sentinel(201) // CUDA_ERROR_INVALID_CONTEXT
	ErrNoBinaryForGPU         = sentinel(209) // CUDA_ERROR_NO_BINARY_FOR_GPU
	ErrPeerAccessUnsupported  = sentinel(217) // CUDA_ERROR_PEER_ACCESS_UNSUPPORTED
	ErrInvalidPTX             = sentinel(218) // CUDA_ERROR_INVALID_PTX
	ErrUnsupportedPTXVersion  = sentinel(222) // CUDA_ERROR_UNSUPPORTED_PTX_VERSION
	ErrInvalidHandle          = sentinel(400) // CUDA_ERROR_INVALID_HANDLE; also objects used after Close (those match errs.Closed too)
	ErrNotFound               = sentinel(500) // CUDA_ERROR_NOT_FOUND
	ErrNotReady               = sentinel(600) // CUDA_ERROR_NOT_READY
	ErrIllegalAddress         = sentinel(700) // CUDA_ERROR_ILLEGAL_ADDRESS
	ErrPeerAccessAlreadyOn    = sentinel(704) // CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED
	ErrPeerAccessNotEnabled   = sentinel(705) // CUDA_ERROR_PEER_ACCESS_NOT_ENABLED
	ErrContextIsDestroyed     = sentinel(709) // CUDA_ERROR_CONTEXT_IS_DESTROYED
	ErrHostMemoryRegistered   = sentinel(712) // CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED
	ErrHostMemoryUnregistered = sentinel(713) // CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED
	ErrMisalignedAddress      = sentinel(716) // CUDA_ERROR_MISALIGNED_ADDRESS
	ErrLaunchFailed           = sentinel(719) // CUDA_ERROR_LAUNCH_FAILED
	ErrNotPermitted           = sentinel(800) // CUDA_ERROR_NOT_PERMITTED
	ErrNotSupported           = sentinel(801) // CUDA_ERROR_NOT_SUPPORTED; also entry points the driver lacks
	ErrCaptureUnsupported     = sentinel(900) // CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
	ErrCaptureInvalidated     = sentinel(901) // CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
	ErrCaptureUnmatched       = sentinel(903) // CUDA_ERROR_STREAM_CAPTURE_UNMATCHED
	ErrCaptureImplicit        = sentinel(906) // CUDA_ERROR_STREAM_CAPTURE_IMPLICIT
	ErrCaptureWrongThread     = sentinel(908) // CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD
	ErrUnknown                = sentinel(999) // CUDA_ERROR_UNKNOWN
)

// ErrNoDriver says CUDA cannot be used in this process: libcuda.so.1 is absent
// or unusable, or cuInit failed. Host-only features keep working.
var ErrNoDriver = errors.New("cuda: no usable CUDA driver")

// check turns a CUresult into nil or an *Error naming op.
func check(op string, r C.CUresult) error {
	if r == 0 {
		return nil
	}
	return newError(op, Result(r))
}

func newError(op string, r Result) error {
	if r == Result(C.UCPX_ERR_NOSYM) {
		sym := symbolNames()[op]
		if sym == "" {
			sym = op
		}
		detail := "the driver does not export " + sym
		if !driverLoaded.Load() {
			detail = "CUDA driver not loaded"
		}
		return &Error{Code: ErrNotSupported.Code, Name: ErrNotSupported.Name, Op: op, Detail: detail}
	}
	return &Error{Code: r, Name: r.String(), Op: op}
}

// invalid reports a bad argument found before any driver call.
func invalid(op, format string, args ...any) error {
	return &Error{Code: ErrInvalidValue.Code, Name: ErrInvalidValue.Name, Op: op, Detail: fmt.Sprintf(format, args...)}
}

// closedErr reports use of an object after Close (or a nil/zero object). The
// driver would answer CUDA_ERROR_INVALID_HANDLE at best and crash at worst, so
// the Go side answers first, with an error matching ErrInvalidHandle and the
// shared "closed" root (a second Close is ErrClosed in every ucpx package).
func closedErr(op, what string) error {
	return &Error{Code: ErrInvalidHandle.Code, Name: ErrInvalidHandle.Name, Op: op, Detail: what + " is closed or was never created", closed: true}
}

// resultNames is the CUresult table of CUDA 13.0 (cuda.h, enum cudaError_enum),
// used to name codes when no driver is loaded.
var resultNames = map[Result]string{
	0:   "CUDA_SUCCESS",
	1:   "CUDA_ERROR_INVALID_VALUE",
	2:   "CUDA_ERROR_OUT_OF_MEMORY",
	3:   "CUDA_ERROR_NOT_INITIALIZED",
	4:   "CUDA_ERROR_DEINITIALIZED",
	5:   "CUDA_ERROR_PROFILER_DISABLED",
	6:   "CUDA_ERROR_PROFILER_NOT_INITIALIZED",
	7:   "CUDA_ERROR_PROFILER_ALREADY_STARTED",
	8:   "CUDA_ERROR_PROFILER_ALREADY_STOPPED",
	34:  "CUDA_ERROR_STUB_LIBRARY",
	36:  "CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER",
	46:  "CUDA_ERROR_DEVICE_UNAVAILABLE",
	100: "CUDA_ERROR_NO_DEVICE",
	101: "CUDA_ERROR_INVALID_DEVICE",
	102: "CUDA_ERROR_DEVICE_NOT_LICENSED",
	200: "CUDA_ERROR_INVALID_IMAGE",
	201: "CUDA_ERROR_INVALID_CONTEXT",
	202: "CUDA_ERROR_CONTEXT_ALREADY_CURRENT",
	205: "CUDA_ERROR_MAP_FAILED",
	206: "CUDA_ERROR_UNMAP_FAILED",
	207: "CUDA_ERROR_ARRAY_IS_MAPPED",
	208: "CUDA_ERROR_ALREADY_MAPPED",
	209: "CUDA_ERROR_NO_BINARY_FOR_GPU",
	210: "CUDA_ERROR_ALREADY_ACQUIRED",
	211: "CUDA_ERROR_NOT_MAPPED",
	212: "CUDA_ERROR_NOT_MAPPED_AS_ARRAY",
	213: "CUDA_ERROR_NOT_MAPPED_AS_POINTER",
	214: "CUDA_ERROR_ECC_UNCORRECTABLE",
	215: "CUDA_ERROR_UNSUPPORTED_LIMIT",
	216: "CUDA_ERROR_CONTEXT_ALREADY_IN_USE",
	217: "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED",
	218: "CUDA_ERROR_INVALID_PTX",
	219: "CUDA_ERROR_INVALID_GRAPHICS_CONTEXT",
	220: "CUDA_ERROR_NVLINK_UNCORRECTABLE",
	221: "CUDA_ERROR_JIT_COMPILER_NOT_FOUND",
	222: "CUDA_ERROR_UNSUPPORTED_PTX_VERSION",
	223: "CUDA_ERROR_JIT_COMPILATION_DISABLED",
	224: "CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY",
	225: "CUDA_ERROR_UNSUPPORTED_DEVSIDE_SYNC",
	226: "CUDA_ERROR_CONTAINED",
	300: "CUDA_ERROR_INVALID_SOURCE",
	301: "CUDA_ERROR_FILE_NOT_FOUND",
	302: "CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND",
	303: "CUDA_ERROR_SHARED_OBJECT_INIT_FAILED",
	304: "CUDA_ERROR_OPERATING_SYSTEM",
	400: "CUDA_ERROR_INVALID_HANDLE",
	401: "CUDA_ERROR_ILLEGAL_STATE",
	402: "CUDA_ERROR_LOSSY_QUERY",
	500: "CUDA_ERROR_NOT_FOUND",
	600: "CUDA_ERROR_NOT_READY",
	700: "CUDA_ERROR_ILLEGAL_ADDRESS",
	701: "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
	702: "CUDA_ERROR_LAUNCH_TIMEOUT",
	703: "CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING",
	704: "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED",
	705: "CUDA_ERROR_PEER_ACCESS_NOT_ENABLED",
	708: "CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE",
	709: "CUDA_ERROR_CONTEXT_IS_DESTROYED",
	710: "CUDA_ERROR_ASSERT",
	711: "CUDA_ERROR_TOO_MANY_PEERS",
	712: "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
	713: "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED",
	714: "CUDA_ERROR_HARDWARE_STACK_ERROR",
	715: "CUDA_ERROR_ILLEGAL_INSTRUCTION",
	716: "CUDA_ERROR_MISALIGNED_ADDRESS",
	717: "CUDA_ERROR_INVALID_ADDRESS_SPACE",
	718: "CUDA_ERROR_INVALID_PC",
	719: "CUDA_ERROR_LAUNCH_FAILED",
	720: "CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE",
	721: "CUDA_ERROR_TENSOR_MEMORY_LEAK",
	800: "CUDA_ERROR_NOT_PERMITTED",
	801: "CUDA_ERROR_NOT_SUPPORTED",
	802: "CUDA_ERROR_SYSTEM_NOT_READY",
	803: "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
	804: "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE",
	805: "CUDA_ERROR_MPS_CONNECTION_FAILED",
	806: "CUDA_ERROR_MPS_RPC_FAILURE",
	807: "CUDA_ERROR_MPS_SERVER_NOT_READY",
	808: "CUDA_ERROR_MPS_MAX_CLIENTS_REACHED",
	809: "CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED",
	810: "CUDA_ERROR_MPS_CLIENT_TERMINATED",
	811: "CUDA_ERROR_CDP_NOT_SUPPORTED",
	812: "CUDA_ERROR_CDP_VERSION_MISMATCH",
	900: "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
	901: "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
	902: "CUDA_ERROR_STREAM_CAPTURE_MERGE",
	903: "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED",
	904: "CUDA_ERROR_STREAM_CAPTURE_UNJOINED",
	905: "CUDA_ERROR_STREAM_CAPTURE_ISOLATION",
	906: "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT",
	907: "CUDA_ERROR_CAPTURED_EVENT",
	908: "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD",
	909: "CUDA_ERROR_TIMEOUT",
	910: "CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE",
	911: "CUDA_ERROR_EXTERNAL_DEVICE",
	912: "CUDA_ERROR_INVALID_CLUSTER_SIZE",
	913: "CUDA_ERROR_FUNCTION_NOT_LOADED",
	914: "CUDA_ERROR_INVALID_RESOURCE_TYPE",
	915: "CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION",
	916: "CUDA_ERROR_KEY_ROTATION",
	999: "CUDA_ERROR_UNKNOWN",
}

// notSupportedErr is an argument ucpx refuses because the driver API it loads does not
// support it (before any driver call).
func notSupportedErr(op, detail string) error {
	return &Error{Code: ErrNotSupported.Code, Name: ErrNotSupported.Name, Op: op, Detail: detail}
}
