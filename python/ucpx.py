"""ucpx from Python: a ctypes module over libucpx.so (the C ABI, include/ucpx.h).

No build step: copy this file next to your program (or put python/ on sys.path) and
point UCPX_LIB at libucpx.so (`make libucpx` builds bin/libucpx.so; without UCPX_LIB
the module looks in ../bin/ next to this file, next to this file, then the loader's
path).

Buffers are raw addresses, so a PyTorch program passes tensor.data_ptr() and
tensor.nbytes, and its stream as torch.cuda.current_stream().cuda_stream:

    import torch, ucpx
    ctx = ucpx.Context(); w = ctx.worker()
    ep = w.connect(peer_address)              # the peer's w.address(), exchanged somehow
    cond = ucpx.CudaCondition(torch.cuda.current_stream().cuda_stream)
    t = torch.empty(n, dtype=torch.uint8, device="cuda")
    req = w.tag_recv(t.data_ptr(), t.nbytes, tag=7, mem_type=ucpx.MEMORY_CUDA, condition=cond)
    ev = torch.cuda.Event(); ev.record()      # torch creates its CUevent on first record
    req.record_event(ev.cuda_event)           # ready only once t holds the message
    other_stream.wait_event(ev)               # any stream may wait on it

Import ucpx before torch where you can: libucpx.so is a Go shared library, which needs
a little static TLS that a process with PyTorch's many libraries loaded may have used up
(dlopen then fails with "cannot allocate memory in static TLS block").

Importing the module sets CUDA_DEVICE_MAX_CONNECTIONS=32 unless the environment sets a
number, as libucpx.so does when it initializes CUDA itself: PyTorch initializes CUDA
lazily, so an import before the first CUDA call gives its context the 32 hardware queues
that staged prepared partitions need (CUDA's default 8 can deadlock them).

Buffers: an integer address (tensor.data_ptr(), ctypes.addressof(buf)), or the buffer
object itself (a ctypes object, a bytearray, a writable memoryview or numpy array, a
tensor), which the operation's Request then keeps alive until the operation ended. A
Request closed, or dropped, while its operation runs: a receive is canceled (nobody can
read what it would get, and it would take a later message of its tag); other
operations run on, and their buffer objects stay alive until they end.

Integer arguments out of their C type's range (a tag past 64 bits, a negative length,
a partition count past int) raise ValueError rather than wrapping.

Errors raise ucpx.Error, whose .code is the ucpx_status value and whose message is
ucpx_last_error's. Every call is safe from any thread.
"""

import ctypes
import operator
import os
import threading

if not os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS"):
    os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = "32"

OK = 0
ERR_INVALID_PARAM = -1
ERR_INVALID_HANDLE = -2
ERR_UNSUPPORTED = -3
ERR_CLOSED = -4
ERR_TIMEOUT = -5
ERR_PEER_FAILED = -6
ERR_CANCELED = -7
ERR_TRUNCATED = -8
ERR_OUT_OF_RANGE = -9
ERR_INVALID_ADDR = -10
ERR_BUSY = -11
ERR_BUFFER_TOO_SMALL = -12
ERR_NO_DEVICE = -13
ERR_AUTH = -14
ERR_REVOKED = -15
ERR_SEND_INCOMPLETE = -16
ERR_OTHER = -100

MEMORY_UNKNOWN = -1
MEMORY_HOST = 0
MEMORY_CUDA = 1
MEMORY_CUDA_MANAGED = 2

WORKER_PROGRESS_THREAD = 1
WORKER_NO_WAKEUP = 2
OP_NONBLOCKING_ENQUEUE = 1

FULL_MASK = (1 << 64) - 1


class Error(Exception):
    """A failed ucpx call: code is the ucpx_status, the message ucpx_last_error's."""

    def __init__(self, code, call, message):
        super().__init__(f"{call}: {_name(code)}: {message}")
        self.code = code
        self.call = call
        self.request = None  # an operation's Request that runs despite the error


def _find_library():
    env = os.environ.get("UCPX_LIB")
    if env:
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    for cand in (os.path.join(here, "..", "bin", "libucpx.so"), os.path.join(here, "libucpx.so")):
        if os.path.exists(cand):
            return cand
    return "libucpx.so"


_lib = ctypes.CDLL(_find_library())

_H = ctypes.c_uint64
_PH = ctypes.POINTER(_H)
_SZ = ctypes.c_size_t
_U64 = ctypes.c_uint64
_VP = ctypes.c_void_p
_I = ctypes.c_int
_UP = ctypes.c_size_t  # uintptr_t
_CP = ctypes.c_char_p

# The declarations of include/ucpx.h: (name, argument types).
_SIGS = {
    "ucpx_context_create": [_PH],
    "ucpx_context_destroy": [_H],
    "ucpx_worker_create": [_H, _I, _PH],
    "ucpx_worker_destroy": [_H],
    "ucpx_worker_address": [_H, _CP, _SZ, ctypes.POINTER(_SZ)],
    "ucpx_worker_progress": [_H, ctypes.POINTER(_I)],
    "ucpx_ep_create": [_H, _CP, _I, _PH],
    "ucpx_ep_destroy": [_H],
    "ucpx_mem_map": [_H, _VP, _SZ, _I, _PH],
    "ucpx_mem_unmap": [_H],
    "ucpx_rkey_pack": [_H, _CP, _SZ, ctypes.POINTER(_SZ)],
    "ucpx_rkey_unpack": [_H, _CP, _PH],
    "ucpx_rkey_region": [_H, ctypes.POINTER(_U64), ctypes.POINTER(_SZ)],
    "ucpx_rkey_destroy": [_H],
    "ucpx_cuda_condition_create": [_UP, _PH],
    "ucpx_condition_record_event": [_H, _UP],
    "ucpx_condition_destroy": [_H],
    "ucpx_tag_send": [_H, _VP, _SZ, _U64, _I, _H, _I, _PH],
    "ucpx_tag_recv": [_H, _VP, _SZ, _U64, _U64, _I, _H, _I, _PH],
    "ucpx_put": [_H, _VP, _SZ, _U64, _H, _I, _H, _I, _PH],
    "ucpx_get": [_H, _VP, _SZ, _U64, _H, _I, _H, _I, _PH],
    "ucpx_ep_flush": [_H, _PH],
    "ucpx_tag_send_wait": [_H, _VP, _SZ, _U64, _I],
    "ucpx_tag_recv_wait": [_H, _VP, _SZ, _U64, _U64, _I, ctypes.POINTER(_SZ), ctypes.POINTER(_U64)],
    "ucpx_tag_sendrecv": [_H, _VP, _SZ, _U64, _VP, _SZ, _U64, _U64, _I, ctypes.POINTER(_SZ), ctypes.POINTER(_U64)],
    "ucpx_request_test": [_H, ctypes.POINTER(_I)],
    "ucpx_request_wait": [_H, _I],
    "ucpx_request_info": [_H, ctypes.POINTER(_SZ), ctypes.POINTER(_U64)],
    "ucpx_request_record_event": [_H, _UP],
    "ucpx_request_cancel": [_H],
    "ucpx_request_free": [_H],
    "ucpx_psend_init": [_H, _H, _VP, _SZ, _I, _U64, _PH],
    "ucpx_precv_init": [_H, _H, _VP, _SZ, _I, _U64, _PH],
    "ucpx_prepare_all": [_PH, _SZ, _I],
    "ucpx_pstart": [_H],
    "ucpx_pready": [_H, _I],
    "ucpx_parrived": [_H, _I, ctypes.POINTER(_I)],
    "ucpx_pwait": [_H, _I],
    "ucpx_pfree": [_H],
}
for _name_, _args in _SIGS.items():
    _f = getattr(_lib, _name_)
    _f.argtypes = _args
    _f.restype = _I
_lib.ucpx_strerror.argtypes = [_I]
_lib.ucpx_strerror.restype = _CP
_lib.ucpx_last_error.argtypes = [_CP, _SZ]
_lib.ucpx_last_error.restype = _SZ


def _name(code):
    return _lib.ucpx_strerror(code).decode()


def last_error():
    """The message of the last failed call on this thread."""
    n = _lib.ucpx_last_error(None, 0)
    buf = ctypes.create_string_buffer(n + 1)
    _lib.ucpx_last_error(buf, n + 1)
    return buf.value.decode(errors="replace")


def _call(name, *args):
    rc = getattr(_lib, name)(*args)
    if rc != OK:
        raise Error(rc, name, last_error())
    return rc


def _new(name, *args):
    h = _H(0)
    _call(name, *args, ctypes.byref(h))
    return h.value


def _new_request(name, *args, keep=(), receive=False):
    """An operation's Request, keeping the buffer objects in keep alive (receive: a
    tag receive, canceled when the Request is closed or dropped while it runs). A call
    that enqueued its operation and then failed at a later step returns a handle with
    its error (ucpx.h): the Error carries it as .request, since the operation still
    runs and its buffer is in use until it ends."""
    _reap()
    keep = tuple(k for k in keep if k is not None)
    h = _H(0)
    rc = getattr(_lib, name)(*args, ctypes.byref(h))
    if rc != OK:
        err = Error(rc, name, last_error())
        err.request = Request(h.value, keep, receive) if h.value else None
        raise err
    return Request(h.value, keep, receive)


# Requests closed or dropped while their operation ran: (handle, buffer objects). Each
# is freed, and its buffers let go, once a test finds it done (_reap, at the next
# operation's call); until then the library may still write or read the buffers.
_running = []
_running_lock = threading.Lock()


def _reap():
    if not _running:
        return
    with _running_lock:  # taken out, so that a close from a __del__ meanwhile appends
        items = _running[:]
        _running.clear()
    left = []
    for h, keep in items:
        done = _I(0)
        rc = _lib.ucpx_request_test(h, ctypes.byref(done))
        if rc == OK and not done.value:
            left.append((h, keep))
        elif rc != ERR_INVALID_HANDLE:
            _lib.ucpx_request_free(h)
    if left:
        with _running_lock:
            _running.extend(left)


def _string(name, handle):
    need = _SZ(0)
    rc = getattr(_lib, name)(handle, None, 0, ctypes.byref(need))
    if rc != ERR_BUFFER_TOO_SMALL:
        raise Error(rc, name, last_error())
    buf = ctypes.create_string_buffer(need.value)
    _call(name, handle, buf, need.value, None)
    return buf.value.decode()


def _uint(value, bits, what):
    """value as an unsigned C integer of bits bits; out of range raises ValueError
    (ctypes would wrap it: a tag 2**64+7 went out as 7, a length 2**64+4 as 4)."""
    v = operator.index(value)
    if not 0 <= v < 1 << bits:
        raise ValueError(f"{what} {value!r}: want 0 to {(1 << bits) - 1}")
    return v


def _int(value, what):
    """value as a C int; out of range raises ValueError."""
    v = operator.index(value)
    if not -(1 << 31) <= v < 1 << 31:
        raise ValueError(f"{what} {value!r}: want {-(1 << 31)} to {(1 << 31) - 1}")
    return v


_PTR_BITS = ctypes.sizeof(ctypes.c_void_p) * 8
_SIZE_BITS = ctypes.sizeof(_SZ) * 8


def _u64(value, what):
    return _uint(value, 64, what)


def _size(value, what="nbytes"):
    return _uint(value, _SIZE_BITS, what)


def _buf(buf, nbytes):
    """(address, object to keep alive, nbytes) of a buffer argument: an integer
    address, or an object whose memory it is (ctypes object, writable buffer, an
    object with data_ptr() such as a tensor); nbytes is checked against the object's
    size where it has one."""
    n = _size(nbytes)
    if buf is None:
        return None, None, n
    if isinstance(buf, (ctypes.c_void_p, ctypes.c_char_p)):
        return ctypes.cast(buf, ctypes.c_void_p).value, None, n  # a pointer: its value, as ctypes passes it
    if isinstance(buf, (ctypes._SimpleCData, ctypes.Array, ctypes.Structure, ctypes.Union)):
        size = ctypes.sizeof(buf)
        address = ctypes.addressof(buf)
    elif hasattr(buf, "data_ptr"):
        address = buf.data_ptr()
        size = getattr(buf, "nbytes", None)
    elif hasattr(buf, "__index__"):
        return _uint(buf, _PTR_BITS, "address"), None, n
    else:
        try:
            view = memoryview(buf)
        except TypeError:
            raise TypeError(f"buffer {type(buf).__name__}: want an address, a ctypes object, a writable buffer or a tensor") from None
        if view.readonly:
            raise TypeError(f"buffer {type(buf).__name__} is read-only")
        if not view.contiguous:
            raise ValueError("buffer is not contiguous")
        size = view.nbytes
        if size == 0:
            return 0, None, _check_size(n, 0)
        # Kept instead of buf: it holds the buffer exported, so a bytearray cannot be
        # resized (moved) while the operation runs.
        buf = (ctypes.c_char * size).from_buffer(view)
        address = ctypes.addressof(buf)
    if size is not None:
        _check_size(n, size)
    return address, buf, n


def _check_size(n, size):
    if n > size:
        raise ValueError(f"nbytes {n}: the buffer has {size}")
    return n


def _ms(timeout):
    """Milliseconds for a C int: None waits forever; more than the int holds is refused
    (ctypes would wrap it, and a wrapped timeout can come out negative: forever)."""
    if timeout is None:
        return -1
    ms = int(timeout * 1000)
    if ms < 0 or ms > 2**31 - 1:
        raise ValueError(f"timeout {timeout!r} s: want 0 to {(2**31 - 1) / 1000} s, or None")
    return ms


class _Handle:
    _destroy = None

    def __init__(self, handle):
        self.handle = handle

    def close(self):
        if self.handle:
            try:
                _call(self._destroy, self.handle)
            except Error as e:
                # BUSY, TIMEOUT: nothing released, the handle stays; close again (a
                # Memory whose importers did not acknowledge in time stays registered).
                if e.code not in (ERR_BUSY, ERR_TIMEOUT):
                    self.handle = 0
                raise
            self.handle = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Context(_Handle):
    """A UCX context (UCX_* environment variables configure it)."""

    _destroy = "ucpx_context_destroy"

    def __init__(self):
        super().__init__(_new("ucpx_context_create"))

    def worker(self, progress_thread=False, no_wakeup=False):
        flags = (WORKER_PROGRESS_THREAD if progress_thread else 0) | (WORKER_NO_WAKEUP if no_wakeup else 0)
        return Worker(_new("ucpx_worker_create", self.handle, flags))

    def mem_map(self, addr, nbytes, mem_type=MEMORY_HOST):
        """Registers nbytes at addr (host or device) for RMA; returns a Memory, which
        keeps a buffer object given as addr alive until it is closed."""
        a, keep, n = _buf(addr, nbytes)
        m = Memory(_new("ucpx_mem_map", self.handle, a, n, _int(mem_type, "mem_type")))
        m._keep = keep
        return m


def _cond(condition):
    return condition.handle if condition is not None else 0


class Worker(_Handle):
    _destroy = "ucpx_worker_destroy"

    def address(self):
        """This worker's address string, for the peer's connect."""
        return _string("ucpx_worker_address", self.handle)

    def progress(self):
        n = _I(0)
        _call("ucpx_worker_progress", self.handle, ctypes.byref(n))
        return n.value

    def connect(self, address, peer_error_handling=False):
        return Endpoint(_new("ucpx_ep_create", self.handle, address.encode(), 1 if peer_error_handling else 0))

    def tag_recv(self, addr, nbytes, tag, mask=FULL_MASK, mem_type=MEMORY_HOST, condition=None, flags=0):
        """Receives into nbytes at addr (tensor.data_ptr(), or the buffer object);
        returns a Request. Closing or dropping it before it completed cancels it."""
        a, keep, n = _buf(addr, nbytes)
        return _new_request("ucpx_tag_recv", self.handle, a, n, _u64(tag, "tag"), _u64(mask, "mask"),
                            _int(mem_type, "mem_type"), _cond(condition), _int(flags, "flags"),
                            keep=(keep,), receive=True)

    def tag_recv_wait(self, addr, nbytes, tag, mask=FULL_MASK, timeout=None):
        """Blocking receive into host memory; returns (length, sender_tag)."""
        a, _, nb = _buf(addr, nbytes)
        n, t = _SZ(0), _U64(0)
        _call("ucpx_tag_recv_wait", self.handle, a, nb, _u64(tag, "tag"), _u64(mask, "mask"), _ms(timeout),
              ctypes.byref(n), ctypes.byref(t))
        return n.value, t.value


class Endpoint(_Handle):
    _destroy = "ucpx_ep_destroy"

    def tag_send(self, addr, nbytes, tag, mem_type=MEMORY_HOST, condition=None, flags=0):
        a, keep, n = _buf(addr, nbytes)
        return _new_request("ucpx_tag_send", self.handle, a, n, _u64(tag, "tag"), _int(mem_type, "mem_type"),
                            _cond(condition), _int(flags, "flags"), keep=(keep,))

    def tag_send_wait(self, addr, nbytes, tag, timeout=None):
        a, _, n = _buf(addr, nbytes)
        _call("ucpx_tag_send_wait", self.handle, a, n, _u64(tag, "tag"), _ms(timeout))

    def unpack_rkey(self, packed):
        return Rkey(_new("ucpx_rkey_unpack", self.handle, packed.encode()))

    def put(self, addr, nbytes, raddr, rkey, mem_type=MEMORY_HOST, condition=None, flags=0):
        return self._rma("ucpx_put", addr, nbytes, raddr, rkey, mem_type, condition, flags)

    def get(self, addr, nbytes, raddr, rkey, mem_type=MEMORY_HOST, condition=None, flags=0):
        return self._rma("ucpx_get", addr, nbytes, raddr, rkey, mem_type, condition, flags)

    def _rma(self, name, addr, nbytes, raddr, rkey, mem_type, condition, flags):
        a, keep, n = _buf(addr, nbytes)
        return _new_request(name, self.handle, a, n, _u64(raddr, "raddr"), rkey.handle, _int(mem_type, "mem_type"),
                            _cond(condition), _int(flags, "flags"), keep=(keep,))

    def flush(self):
        return _new_request("ucpx_ep_flush", self.handle)


class Memory(_Handle):
    _destroy = "ucpx_mem_unmap"

    def pack_rkey(self):
        """The remote key string (carries the region's base and length)."""
        return _string("ucpx_rkey_pack", self.handle)


class Rkey(_Handle):
    _destroy = "ucpx_rkey_destroy"

    def region(self):
        base, n = _U64(0), _SZ(0)
        _call("ucpx_rkey_region", self.handle, ctypes.byref(base), ctypes.byref(n))
        return base.value, n.value


class CudaCondition(_Handle):
    """A stream condition on a raw CUDA stream of device 0's primary context
    (torch.cuda.current_stream().cuda_stream): operations given it start in stream order,
    and later work on the stream waits for them (unless OP_NONBLOCKING_ENQUEUE)."""

    _destroy = "ucpx_condition_destroy"

    def __init__(self, cuda_stream):
        super().__init__(_new("ucpx_cuda_condition_create", _uint(cuda_stream, _PTR_BITS, "stream")))

    def record_event(self, cuda_event):
        """Records the raw CUevent once every operation armed so far has completed."""
        _call("ucpx_condition_record_event", self.handle, _uint(cuda_event, _PTR_BITS, "event"))


class Request(_Handle):
    _destroy = "ucpx_request_free"

    def __init__(self, handle, keep=(), receive=False):
        super().__init__(handle)
        self._keep = keep  # the buffer objects the operation uses
        self._receive = receive

    def close(self):
        """Frees the request. One still running: a receive is canceled first (before,
        it stayed posted and took a later message of its tag into a buffer that may
        be gone); another operation runs on, and the handle and buffer objects are
        kept until it ended (freed at a later operation's call)."""
        h = self.handle
        if not h:
            return
        self.handle = 0
        keep, self._keep = self._keep, ()
        done = _I(0)
        rc = _lib.ucpx_request_test(h, ctypes.byref(done))
        if rc == OK and not done.value and self._receive:
            _lib.ucpx_request_cancel(h)
            rc = _lib.ucpx_request_test(h, ctypes.byref(done))
        if rc == ERR_INVALID_HANDLE:
            raise Error(rc, "ucpx_request_free", last_error())
        if rc == OK and not done.value:
            with _running_lock:
                _running.append((h, keep))
            return
        _lib.ucpx_request_free(h)

    def __del__(self):
        # A request dropped without close is closed with the object (the library's
        # handle table would keep it for good). Only requests: a context or worker
        # closes its children.
        try:
            self.close()
        except Exception:
            pass

    def test(self):
        done = _I(0)
        _call("ucpx_request_test", self.handle, ctypes.byref(done))
        return bool(done.value)

    def wait(self, timeout=None):
        """Waits for completion (seconds, None: forever); raises Error on failure."""
        _call("ucpx_request_wait", self.handle, _ms(timeout))

    def info(self):
        """(received length, sender tag) of a completed receive."""
        n, t = _SZ(0), _U64(0)
        _call("ucpx_request_info", self.handle, ctypes.byref(n), ctypes.byref(t))
        return n.value, t.value

    def record_event(self, cuda_event):
        """Records the raw CUevent (torch.cuda.Event().cuda_event, after a first record)
        on the condition's stream, ready only once this operation completed."""
        _call("ucpx_request_record_event", self.handle, cuda_event)

    def cancel(self):
        _call("ucpx_request_cancel", self.handle)


class Partitioned(_Handle):
    """A prepared partitioned send or receive (host memory)."""

    _destroy = "ucpx_pfree"

    def __init__(self, send, worker, ep, addr, nbytes, partitions, tag):
        name = "ucpx_psend_init" if send else "ucpx_precv_init"
        a, keep, n = _buf(addr, nbytes)
        super().__init__(_new(name, worker.handle, ep.handle, a, n, _int(partitions, "partitions"), _u64(tag, "tag")))
        self._keep = keep

    def start(self):
        _call("ucpx_pstart", self.handle)

    def pready(self, p):
        _call("ucpx_pready", self.handle, _int(p, "partition"))

    def parrived(self, p):
        a = _I(0)
        _call("ucpx_parrived", self.handle, _int(p, "partition"), ctypes.byref(a))
        return bool(a.value)

    def wait(self, timeout=None):
        _call("ucpx_pwait", self.handle, _ms(timeout))


def prepare_all(reqs, timeout=None):
    arr = (_H * len(reqs))(*[r.handle for r in reqs])
    _call("ucpx_prepare_all", arr, len(reqs), _ms(timeout))
