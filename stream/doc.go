// Package stream is ucpx's execution-context layer: ordered queues of work (streams),
// points in them (events) and the 64-bit signal words through which a stream and a
// proxy thread (or a GPU kernel) hand work to each other. Everything above it —
// conditions, graph nodes, the proxy engine — is written against these interfaces
// and runs unchanged on either backend.
//
// The interfaces, the words, Kind, Compare and the error sentinels are defined in
// package stream/streamcore, which has no backend and imports no CUDA package, so
// those layers do not link the CUDA backend; this package re-exports them under the
// same names (stream.Stream is streamcore.Stream) and adds the backends, Open and the
// CUDA accessors.
//
// # Objects
//
// A Backend creates the other objects, all of one Kind:
//
//   - Stream: an ordered queue. WriteValue, WaitValue, LaunchHostFunc, Copy, Record
//     and WaitEvent enqueue and return at once; the work runs later, in the order of
//     the calls. Synchronize waits for everything enqueued before it; Query asks
//     without waiting. A failure is sticky: the stream stops running work and every
//     later call returns the error, as after a CUDA sticky error.
//   - Event: a position in a stream, captured by Record. It is done once the work
//     enqueued before the Record has run; an event never recorded is done. WaitEvent
//     on another stream holds that stream's later work until the event is done, using
//     the record current when WaitEvent was called (recording again later does not
//     move an enqueued wait).
//   - Word (in a WordBlock from AllocWords): a 64-bit signal word in memory that C,
//     Go and, on CUDA, the GPU may all address — never Go memory. Load, Store, Add and
//     CompareAndSwap are atomic. WaitValue's Compare values (GEQ, EQ, AND, NOR) follow
//     CUDA's stream memops; GEQ is wrap-aware (signed difference), so counters may wrap.
//     After storing a word a CUDA stream may be waiting on, WordBlock.Ring makes the
//     GPU look at its pending waits again soon (it otherwise rechecks a memop wait
//     only now and then); it is never needed for correctness. The race detector sees
//     the ordering the words carry: a load that reads a stored value is ordered after
//     the storing goroutine's earlier work, as with sync/atomic on Go memory.
//
// Objects of one backend may not be handed to another: a CUDA event given to a host
// stream is refused with ErrWrongBackend, and so is a host word given to a CUDA stream
// (the GPU cannot address C memory). The one exception is deliberate: host streams
// accept words of a CUDA block, since the CPU reads host-mapped pinned memory like any
// other. Errors wrap the sentinels ErrClosed,
// ErrInvalidArgument, ErrNotSupported and ErrWrongBackend; test them with errors.Is.
//
// # Backends and selection
//
// The host backend (NewHostBackend) is the embedded default and what CI exercises:
// each stream is one goroutine executing its queue, words are C memory, Copy is a
// memmove. It needs no GPU and no driver. The CUDA backend drives CUstreams through
// the driver API (loaded at run time; libcuda is never linked), with words in
// host-mapped pinned memory and WriteValue/WaitValue as stream memops.
//
// Open(Auto) uses CUDA device 0 when a driver and a device are present and the host
// backend otherwise; Open(Host) never touches CUDA; Open(CUDA) fails with an error
// wrapping ErrNotSupported (and the CUDA layer's cause, such as cuda.ErrNoDriver)
// where CUDA is unavailable. SelectionFromEnv reads UCPX_BACKEND=host|cuda|auto.
//
// # Memory rules
//
// Copy takes raw addresses: C memory, pinned host memory or device memory, never
// unpinned Go memory (the garbage collector may move or free it while the copy is
// queued; pin it with runtime.Pinner for the copy's lifetime if you must). Copy
// refuses zero or negative lengths, nil addresses and overlapping ranges; it cannot
// check that an address is mapped.
//
// A WordBlock must outlive the work that names its words: close it after the streams
// using it are synchronized. Host streams are defensive about this: a word whose
// block was closed fails the stream with an error wrapping ErrClosed instead of
// touching freed memory (the block's free waits, through quiesceWordAccess, for any
// executor caught between its check and its access). Word blocks are not freed by Backend.Close; their owner
// closes them.
//
// # The host executor
//
// Each host stream is a goroutine. Enqueueing takes a mutex, appends the operation by
// value to a slice and, only if the executor is parked, hands it a wake-up token:
// tens of nanoseconds and no allocation. The executor swaps the whole slice out and
// runs it without holding the lock. When its queue is empty it keeps polling for
// about 20 µs (an enqueue right after is seen within a cache-line transfer), then
// parks until the next enqueue.
//
// Most words are written by other goroutines, C threads, a peer's RMA or the GPU
// with plain stores, which notify nobody, so WaitValue polls the word: back to back
// for the first 20 µs, then with a runtime.Gosched every 5 µs until 200 µs, then
// sleeping between polls with a doubling interval capped at 100 µs. A writer that
// notifies the word's block (WordBlock.Notify: the engine storing a completion word,
// a host stream's CopyWord) ends such a sleep at once; the timer is the fallback for
// the others. (Go's timers round sleeps under a millisecond up to
// about 1 ms in an otherwise idle process, so an unnotified write after a long wait
// may be seen up to ~1 ms late; a busy process sees it sooner.)
// Waits on events of other host streams do not poll: after a short spin they sleep
// until that stream makes progress.
//
// A host func runs on the executor goroutine; it must return, and must not
// Synchronize or Close its own stream, Close its backend or wait on an event recorded
// on its stream after it (Event.Synchronize): those would wait for the func itself,
// so host streams refuse them with an error wrapping ErrInvalidArgument. The same
// holds through other host streams: a host func's Synchronize, Event.Synchronize,
// Close or Backend.Close that waits for a stream which waits (directly, through
// WaitEvent, a host func's wait of its own, or a chain of such streams) for the
// func's stream past the func would never end either, and is refused the same way:
// the host func's wait that closes the cycle (with two host funcs waiting for each
// other's streams, either one, depending on timing), or, where a WaitEvent closes
// it, a host func's Synchronize waiting in it. A wait on another stream that forms no cycle
// blocks as from any goroutine, but holds the func's stream up meanwhile: portable
// code waits outside host funcs, as CUDA forbids host funcs any CUDA call. It may
// enqueue on any host stream, its own included (the work runs after it returns); a
// CUDA host func must not call CUDA at all, enqueueing included. A panic in it (or,
// on a host stream, runtime.Goexit) becomes the stream's sticky error, a *PanicError
// (its Value is ErrGoexit for a Goexit, so errors.Is(err, ErrGoexit) tells the two
// apart). On a CUDA stream too a panic in a host func is recovered on the driver's
// thread and becomes the stream's sticky *PanicError (Synchronize, Query, Failed and
// later enqueues return it), though the GPU still runs the work already queued behind
// it. A CUDA host func must not call runtime.Goexit (testing's FailNow and SkipNow do):
// it runs on the driver's thread, where Go ends the process on a Goexit.
//
// Close refuses new work, runs what is queued and stops the goroutine. A wait that
// does not hold when reached gets a grace period (DefaultCloseGrace, WithCloseGrace)
// and is then abandoned along with the work behind it: Close returns an error
// wrapping ErrAbandoned (which wraps ErrClosed), and events past that point report
// it too. Close never hangs on a word nobody writes.
package stream
