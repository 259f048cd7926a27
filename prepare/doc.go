// Package prepare holds persistent, partitioned operations with a prepare phase, after
// MPI 4 partitioned communication (MPI_Psend_init, MPI_Precv_init, MPI_Pready,
// MPI_Parrived).
//
// PsendInit and PrecvInit make persistent requests whose buffer is split into equal
// partitions (the two sides' counts may differ). PrepareAll (or the first Start)
// matches each request with its peer's by (endpoint, tag, order of init) in one
// exchange and learns everything later iterations need: the receiver's buffer and
// arrival counters and the sender's ready flags, as remote keys. After that no
// iteration matches anything (Stats.TagMatches stays 1):
//
//   - the receiver's Start tells the sender, with one RDMA write, that every partition
//     of this iteration may move (receiver readiness, resolved ahead of the data);
//   - the sender's Pready(p) moves partition p as one put-with-signal
//     (ucp.Endpoint.PutSignalNbx) as soon as its ready flag is set, without waiting on
//     the host: from the host (Pready, PreadyRange, PreadyList), in stream order
//     (PreadyOnStream) or as a node of a host or CUDA graph (PreadyNode, where every
//     launch is an iteration with no host call);
//   - the receiver sees partitions arrive one by one (Parrived, ArrivedOnStream) and
//     the iteration complete (Wait, Test, WaitOnStream).
//
// Kernels take part through Request.DeviceHandle (fetched after every Start), passed
// as struct ucpx_partition_handle: ucpx_pready(h, p) in device/ucpx_signal.cuh makes a
// sender partition ready (the CPU's engine then moves it, as a kernel-triggered
// operation), ucpx_parrived(h, q) and ucpx_pstatus(h, q) see receive partitions
// arrive. PreadyHandle and ParrivedHandle do the same from host goroutines.
//
// A sender's iteration completes (Wait, Test) once the buffer may be reused. The
// receiver acknowledges each iteration with one small write, which the sender's worker
// registry waits for in the background (progressing the worker until it lands): UCX
// may hold a put-with-signal's signal in the sender's queue after reporting it
// complete, so a sender that stopped progressing after its Wait would otherwise leave
// the receiver waiting. The receiver's Wait returns once its acknowledgement was sent. Between
// iterations neither side needs progressing. A partition made ready before the
// receiver's readiness arrived moves when it arrives even if the sender calls nothing
// more: the worker's registry moves it (and progresses the worker for it) once it has
// waited 200 µs; an application that goes on to Test or Wait moves it sooner itself.
// The receiver's Parrived, Test and Wait drive its worker, or the worker has
// ucp.WorkerParams.ProgressThread.
//
// Device buffers (Params.MemoryType ucp.MemoryCUDA, on a CUDA Backend) whose peer
// CUDA IPC reaches (one host, both contexts with ucp.ContextParams.Device, peer access
// between the devices: ucp.Endpoint.Reach) take the direct path: nothing is staged.
// The receiver's buffer is exported as a device region and its arrival counters are
// Signals in memory both processes map; a partition is one copy-engine copy into the
// receiver's buffer followed by a stream write of the iteration into its counter, on
// the stream the partition became ready on (PreadyOnStream), on the worker's stream
// (Pready), issued by the engine at a kernel's ucpx_pready, or — with PreadyNode in a
// CUDA graph — as the graph's own memcpy and memop nodes, with no CPU per launch.
//
// Other device buffers are staged: each partition travels through a host copy of the
// buffer, copied on a stream — the caller's for PreadyOnStream, one of the request's
// own streams for Pready and ucpx_pready, after the receiver's readiness and before
// the partition's put; on the receiver the request's streams copy each partition into
// the device buffer once it arrived, and only then do Parrived, ArrivedOnStream, Wait
// and ucpx_parrived report it. No host thread waits for a copy. PreadyNode refuses
// staged requests (ErrUnsupported).
//
// Staging pre-enqueues memop waits on the request's streams (up to 8 per request)
// that only the peer's data or the caller's kernels answer. CUDA runs a process's
// streams on CUDA_DEVICE_MAX_CONNECTIONS hardware queues; with more streams than
// queues, a kernel that would answer such a wait can be queued behind it and the
// iteration never completes (measured: the kernel test hung at CUDA's default of 8
// and passes at 32). ucpx sets 32 when it initializes CUDA and the environment does
// not choose (cgo/cuda.Load); where another library initialized CUDA first (PyTorch
// in a Python process), set CUDA_DEVICE_MAX_CONNECTIONS=32 before that library does.
//
// A dead peer completes Wait and Parrived with its error (matching ucp.ErrPeerFailed)
// and releases every stream, graph and kernel waiting on the request; closing the
// request's endpoint (Params.Peer), its worker or its context does the same with
// ErrClosed, and later Starts fail with it at once. The contents of a
// receive buffer in an iteration that failed are undefined. Requests that cannot be
// matched — buffers of different lengths, partition counts that do not split the
// peer's buffer — fail on both sides with ErrInvalidParam: the side that finds out
// answers the handshake with a refusal. A request whose peer's request was freed
// before they matched fails with ErrCanceled the same way. A partition has at most one
// PreadyNode in a graph (each takes one readiness per launch).
//
// Free refuses an iteration in flight (ErrBusy) until it completes, its peer fails, or
// its endpoint or worker closes: a peer still running it may write into the request's
// memory (once it ended, the registrations Free closes are revoked at the peer before
// that memory is released). A live peer that never does its part leaves the iteration
// in flight; closing the endpoint ends it. Free looks for a peer failure itself (it
// progresses the worker once), so a request whose peer died is freed by Free alone,
// retried until UCX noticed.
//
// A sender's handshake that comes before the receiver's request is kept for it within
// bounds, per worker and per peer, and for about a second; a sender resends its
// handshake every 20 ms until it is answered, so one dropped costs a resend. Handshakes
// nobody asks for (a faulty or hostile peer's) cannot grow the process.
package prepare
