// Package ucp is the Go API of ucpx over UCX's ucp layer. Its calls mirror
// ucp_*_nbx: Endpoint.TagSendNbx, Worker.TagRecvNbx, Endpoint.AmSendNbx,
// Endpoint.PutNbx / GetNbx / AtomicNbx, Endpoint.FlushNbx and Worker.FlushNbx, with
// a RequestParam that mirrors ucp_request_param_t and a Request that tracks the
// operation. Errors are UCX statuses (Status) wrapped in *OpError; test them with
// errors.Is against the sentinels (ErrMessageTruncated, ErrCanceled, ErrPeerFailed, ...).
//
// # Objects
//
// A Context holds the UCX configuration (UCX_* environment variables, plus
// ContextParams.Config) and memory registrations (MemMap, MemMapPtr, MemAlloc). A Worker
// is a progress engine; Endpoints connect it to peer workers, either through a Listener
// (client-server on a socket address: Worker.Listen, Listener.Accept, Worker.Connect;
// authenticated with the context's auth key, ContextParams.AuthKey, before anything else
// crosses) or through a worker address (Worker.Address, Worker.ConnectAddress). Every object has
// an explicit Close; closing a parent closes its children, a second Close returns
// ErrClosed, and Live reports the UCX handles still open (tests assert it is zero).
//
// # Tags
//
// Tags are 48 bits (MaxTag): the top 16 bits of UCX's tag are ucpx's: 15 carry the
// sending worker's source id, so that a receiver can bound what each peer leaves
// unmatched (WorkerParams.UnmatchedLimit: a peer past it is cut off with an
// *UnmatchedLimitError), and the top one marks a message of device memory whose data
// the receiver pulls by CUDA IPC after matching (below). Receive masks may have any
// bits set; SenderTag never shows ucpx's bits.
//
// # Progress model
//
// UCX makes progress only when ucp_worker_progress is called. In ucpx:
//
//   - Request.Wait drives the worker's progress itself, with one wait policy (wait.go):
//     it spins (256 progress calls per cgo call, no Gosched) for WorkerParams.SpinTime,
//     yielding the processor to other threads (sched_yield) past 100 µs; then, on a
//     worker with wakeup, it arms the event fd (ucp_worker_arm) and parks in Go's
//     netpoller on it until it fires, the request completes on another goroutine, ctx
//     ends, the worker closes or a bound passes (50 ms doubling to 1 s, then one
//     progress pass: UCX 1.13 can leave an arrival unsignalled; 1 ms while CUDA IPC
//     copies are pending): no OS thread blocked per waiter (one waiter sleeps on the
//     fd, the others on channels it wakes).
//     Without wakeup (WorkerParams.NoWakeup) it keeps polling, as ucx_perftest does.
//     Request.Test runs one round.
//   - The blocking calls Endpoint.TagSend, Worker.TagRecv and Endpoint.TagSendRecv
//     post and spin in one cgo call and allocate nothing; RequestParam.Request reuses a
//     caller-owned Request in loops of nbx calls.
//   - A condition.Chain (RequestParam.Chain) runs without Go between its operations:
//     the UCX callback that completes one step posts the next, in C; Chain.Wait
//     drives progress with the same policy.
//   - Worker.EventFD and Worker.Arm expose the fd for a program's own event loop.
//   - Worker.Progress runs one round; Worker.WaitForEvents blocks on the event fd. A
//     server that only answers (flushes, one-sided operations emulated over tcp, AM
//     handlers, listener connection requests) must call them, typically from a loop on
//     its own goroutine. Listener.Accept drives progress while it waits.
//   - Endpoint creation by socket address (Connect) completes only while the listening
//     side makes progress, as in UCX.
//
// Any goroutine may call any method: each worker serialises its UCX calls with one
// mutex, and the worker is created in UCS_THREAD_MODE_SERIALIZED (UCX takes no locks of
// its own; calls may come from any OS thread). Contexts are created with
// mt_workers_shared so registrations may happen concurrently with worker calls. (The C
// ABI's workers also have an owner word that its blocking calls take from C without
// entering Go; the mutex's holder holds it too. Nothing of it shows in this API.)
//
// UCX callbacks never call into Go. A completion of an operation without a Callback
// only fills its request in C: the call waiting on it (Request.Wait, the blocking calls)
// reads and frees it in the same cgo call, and every progressing call reaps the others
// into an array Go reads without a further call. Operations with a Callback, endpoint
// errors, connection requests and active messages go through a per-worker event queue,
// which the goroutine that drove progress drains after the call. Request callbacks,
// endpoint error handlers, connection handlers and AM handlers therefore run on that
// goroutine, after the worker lock is released, so they may call any ucpx method (but
// must not block waiting for progress that only they would drive).
//
// # Immediate completion
//
// As in UCX, an operation that completes in place returns a Request that is already
// done and its Callback does not run; set NoImmediateCompletion to always get the
// callback. Sends that complete in place share one immutable Request, so the common
// small-message path allocates nothing.
//
// # Memory
//
// C never keeps a Go pointer beyond a call. A buffer of an operation that stays pending
// is pinned (runtime.Pinner) until the operation completes; MemMap pins its buffer until
// Close. Memory from MemAlloc is C memory allocated and registered by UCX: the buffer a
// hot path should reuse (pass it in RequestParam.MemH). Packed rkeys and worker addresses
// travel sealed (encrypted and authenticated under the auth key, bound to the sender), so
// garbage, forgeries and keys replayed by another peer give ErrInvalidParam, ErrAuth or
// ErrInvalidAddr, never a crash inside UCX, and RMA ranges are checked against the
// remote region before UCX sees them (ErrOutOfRange). MemH.Close revokes the region's key:
// peers' later use fails with ErrRevoked (README, "Trust model").
//
// # Device memory on one host
//
// With ContextParams.Device, device regions of a peer on the same host (CUDA IPC) are
// reached by the copy engine: RMA on them is a copy into the peer's mapping. Tag and
// active messages of a MemoryCUDA buffer to such a peer carry no data: the sender
// sends a sealed descriptor (under the tag's pull bit for tags), and the receive that
// matches it (any receive: nbx, blocking, chained, staged, conditioned; for active
// messages, RecvData) copies the data out of the sender's buffer before it completes;
// the send completes once the receiver said so. A receive shorter than the message
// completes with ErrMessageTruncated and the send still completes; a message shorter
// than its descriptor (a few hundred bytes) is staged instead.
//
// # Peer failure
//
// Endpoints use UCP_ERR_HANDLING_MODE_PEER unless EndpointParams.NoPeerErrorHandling is
// set: a failed peer completes pending operations on the endpoint with an error matching
// ErrPeerFailed and runs the endpoint's ErrorHandler. Tag receives are not tied to an
// endpoint in UCX; name the expected sender in RequestParam.Peer and the receive fails
// with the peer's error too. UCX 1.13 selects only tcp for endpoints with peer error
// handling; shared memory needs NoPeerErrorHandling. There UCX notices no dead peer,
// but ucpx watches a peer on the same machine through a pidfd and fails its endpoint,
// and the receives naming it, when it exits; a peer on another host is then noticed
// only through the caller's context deadline.
package ucp
