package prepare

import (
	"context"
	"encoding/binary"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"time"
	"unsafe"

	"github.com/ucpx/ucpx/condition"
	"github.com/ucpx/ucpx/internal/backoff"
	"github.com/ucpx/ucpx/internal/errs"
	"github.com/ucpx/ucpx/stream"
	"github.com/ucpx/ucpx/stream/streamcore"
	"github.com/ucpx/ucpx/ucp"
)

// Params describes one persistent, partitioned operation.
type Params struct {
	// Peer is the endpoint of the partner (the receiver of a PsendInit, the sender of a
	// PrecvInit). Requests are matched with the peer's by (Peer, Tag, order of init).
	Peer *ucp.Endpoint
	// Tag matches the request with the peer's, as in MPI_Psend_init.
	Tag uint64
	// Partitions splits the buffer into that many equal parts. The sender's and the
	// receiver's counts may differ (the buffer's length must be a multiple of each).
	// An empty buffer is refused (ErrInvalidParam), where MPI allows a count of 0.
	Partitions int
	// MemH, if set, is a registration covering the buffer; otherwise the buffer is
	// registered by the request (and deregistered by Free).
	MemH *ucp.MemH
	// Backend is the backend of the streams and graphs the request is used with
	// (PreadyOnStream, ArrivedOnStream, PreadyNode); nil means host streams.
	Backend stream.Backend
	// MemoryType of buf: host memory (the zero value) or, on a CUDA Backend, device
	// memory (ucp.MemoryCUDA, ucp.MemoryCUDAManaged; buf from ucp.DeviceBuffer). A
	// MemoryCUDA buffer whose peer CUDA IPC reaches moves directly (see the package
	// documentation); other device buffers are staged: each partition travels
	// through a host copy of the buffer, copied on a stream (see Request.Pready), so
	// up to 1024 partitions.
	MemoryType ucp.MemoryType

	stage bool // tests: stage a host buffer as a device one
}

// Stats counts what a request did.
type Stats struct {
	// Iterations completed (Wait or Test reported them done).
	Iterations uint64
	// TagMatches is the number of matching steps the request took: one, in the
	// prepare phase. It stays constant over iterations: matching is off the
	// critical path.
	TagMatches uint64
	// Puts is the number of partitions moved (sender) by host calls, streams and
	// kernels; a PreadyNode counts once, when its nodes are made. A graph's launches
	// run with no host call and count in neither Puts nor Iterations: the graph's
	// owner counts its launches.
	Puts uint64
}

// Errors: the roots every ucpx package shares.
var (
	ErrInvalidParam = errs.InvalidParam
	ErrClosed       = errs.Closed
	ErrBusy         = errs.Busy
	ErrCanceled     = errs.Canceled
	ErrUnsupported  = errs.Unsupported
)

type role uint8

const (
	sender role = iota + 1
	receiver
)

func (r role) String() string {
	if r == sender {
		return "send"
	}
	return "recv"
}

// Request is a persistent partitioned operation (MPI_Psend_init / MPI_Precv_init).
// Its methods are safe for concurrent use.
type Request struct {
	role    role
	w       *ucp.Worker
	reg     *registry
	peer    *ucp.Endpoint
	tag     uint64
	index   int // order of init among this worker's requests of (peer, tag, role)
	buf     []byte
	parts   int
	memh    *ucp.MemH
	ownMemh bool
	backend stream.Backend
	ownBack bool
	// dropFailureHook takes back the peer's failure hook (Free): the endpoint would
	// keep the freed request, buffer and all, as long as it lives.
	dropFailureHook func()
	// xfer is the memory the puts read (sender) or land in (receiver), registered by
	// memh: buf itself, or a staged request's host copy of it (st).
	xfer []byte
	st   *staging
	// direct: a device buffer moved by CUDA IPC (direct.go), neither side staged.
	direct bool
	// clearingNodes: PreadyNode added graph nodes (under mu) that take a ready flag
	// by clearing it at every launch — the direct path's, and CUDA graph gates — which
	// takes the failure value too (see holdFailed).
	clearingNodes bool

	// Words of this side: a sender's ready flags (one per own partition, set to the
	// iteration by the receiver's Start, taken by storing 0), a receiver's arrival
	// counters (one per sender partition, set to the iteration by each partition's
	// put).
	words *ucp.Signals
	// Sender: its ack word (see ackWord), a slot of the worker's registry.
	ack ackSlot
	// Receiver: ones, the source of the one RDMA write that sets every ready flag,
	// and one word more, the source of the ack write.
	ones *ucp.MemH

	mu       sync.Mutex
	prepared chan struct{} // closed once the peer's handshake arrived
	peerInfo handshake
	// nodes: the partitions with a PreadyNode, by graph (under mu).
	nodes map[graphPart]bool
	// gates: the gate node PreadyNode added last to each CUDA graph (graph.CUDA), which
	// the next one waits after (under mu; see gateNodeLocked).
	gates map[any]condition.Node
	// refusedPeer: r refused the peer's handshake (onHandshake), and answers its
	// resends with the refusal again.
	refusedPeer bool
	sent        bool         // the own handshake went out
	hsData      []byte       // its bytes, alive until the send completed
	hsReq       *ucp.Request // its send
	sentAt      time.Time    // when it was (last) sent
	remote      remote
	err         error // the peer failed (or the request was freed)
	freed       bool

	iter   uint64 // iterations started
	active bool   // an iteration started and not yet completed
	// Sender: which partitions were made ready this iteration, which of those are
	// waiting for the receiver's flag, and the puts in flight.
	readied []bool
	nready  int // partitions readied this iteration
	// Partitions 0..nlanded-1 of this iteration are known to be in place (receiver)
	// or moved by a kernel (a direct sender, movedLocked).
	nlanded  int
	waiting  []int
	taken    []int  // pumpLocked's scratch
	awaiting uint64 // the iteration whose waiting partitions the mover knows of
	// Sender: sentWord holds the last iteration whose partitions all moved (streams of
	// WaitOnStream wait on it); sentWatched: the iteration the registry watches for it.
	sentWord    *stream.WordBlock
	sentWatched uint64
	inflight    []*ucp.Request
	// Sender: iters is the source of the arrival counters' write after a run of
	// partitions moved as one put (the run's words hold the iteration).
	iters *ucp.MemH
	// Receiver: the ready write of the current iteration.
	readyReq *ucp.Request
	// iterErr is the first failure of the current iteration's own operations (a put
	// refused at issue): the iteration completes with it.
	iterErr error
	// Sender: the flush that shows the iteration reached the receiver if its ack did
	// not come first (see ackWord). Receiver: the write that tells the sender an
	// iteration completed.
	ackReq  *ucp.Request
	ackIter uint64 // the iteration ackReq acknowledges

	streamConds map[stream.Stream]*condition.Condition
	// streams: the streams given work that reads the request's words or memory
	// (recorded before the work is enqueued, under mu); Free frees them only once
	// each stream passed that work.
	streams    streamcore.StreamSet
	graphConds []*condition.Condition
	dev        *deviceState // sender: DeviceHandle's conditions (device.go); nil until used

	stats Stats
}

// remote is what the prepare phase learned of the peer.
type remote struct {
	parts int
	// Sender: the receiver's buffer and arrival counters. Receiver: the sender's
	// ready flags.
	bufKey, wordKey   *ucp.Rkey
	bufBase, wordBase uint64
	// Receiver: the sender's ack word.
	ackKey  *ucp.Rkey
	ackBase uint64
}

// PsendInit makes a persistent partitioned send of buf to p.Peer.
func PsendInit(w *ucp.Worker, buf []byte, p Params) (*Request, error) {
	return initRequest(sender, w, buf, p)
}

// PrecvInit makes a persistent partitioned receive into buf from p.Peer.
func PrecvInit(w *ucp.Worker, buf []byte, p Params) (*Request, error) {
	return initRequest(receiver, w, buf, p)
}

func initRequest(ro role, w *ucp.Worker, buf []byte, p Params) (*Request, error) {
	op := "p" + ro.String() + "_init"
	switch {
	case w == nil:
		return nil, fmt.Errorf("%s: nil worker: %w", op, ErrInvalidParam)
	case p.Peer == nil || p.Peer.Worker() != w:
		return nil, fmt.Errorf("%s: Peer must be an endpoint of the worker: %w", op, ErrInvalidParam)
	case p.Partitions <= 0 || p.Partitions > maxPartitions:
		return nil, fmt.Errorf("%s: %d partitions (want 1 to %d): %w", op, p.Partitions, maxPartitions, ErrInvalidParam)
	case len(buf) == 0:
		return nil, fmt.Errorf("%s: an empty buffer (a prepared request moves at least one byte per partition): %w", op, ErrInvalidParam)
	case len(buf)%p.Partitions != 0:
		return nil, fmt.Errorf("%s: %d bytes do not split into %d equal partitions: %w", op, len(buf), p.Partitions, ErrInvalidParam)
	case p.MemoryType < ucp.MemoryUnknown || p.MemoryType > ucp.MemoryROCmManaged:
		return nil, fmt.Errorf("%s: unknown memory type %d: %w", op, int(p.MemoryType), ErrInvalidParam)
	case p.MemoryType != ucp.MemoryHost && !isDevice(p.MemoryType):
		return nil, fmt.Errorf("%s: %s buffers: %w", op, p.MemoryType, ErrUnsupported)
	case isDevice(p.MemoryType) && !deviceBackend(p.Backend):
		return nil, fmt.Errorf("%s: a %s buffer needs a CUDA Params.Backend: %w", op, p.MemoryType, ErrInvalidParam)
	case isDevice(p.MemoryType) && p.MemH != nil:
		return nil, fmt.Errorf("%s: MemH with a %s buffer (the request registers its own host copy): %w", op, p.MemoryType, ErrInvalidParam)
	case p.MemH != nil && (p.MemH.Address() > ptrOf(buf) || ptrOf(buf)+uintptr(len(buf)) > p.MemH.Address()+uintptr(p.MemH.Len())):
		return nil, fmt.Errorf("%s: MemH does not cover the buffer: %w", op, ErrInvalidParam)
	}
	direct := directPath(w, p)
	staged := !direct && (isDevice(p.MemoryType) || p.stage)
	if staged && p.Partitions > maxStagedPartitions {
		return nil, fmt.Errorf("%s: %d partitions of a %s buffer (at most %d: each is staged on a stream): %w", op, p.Partitions, p.MemoryType, maxStagedPartitions, ErrInvalidParam)
	}
	r := &Request{
		role: ro, w: w, peer: p.Peer, tag: p.Tag, buf: buf, xfer: buf, parts: p.Partitions,
		memh: p.MemH, backend: p.Backend, prepared: make(chan struct{}),
		streamConds: map[stream.Stream]*condition.Condition{},
	}
	if r.backend == nil {
		b, err := stream.Open(stream.Host)
		if err != nil {
			return nil, err
		}
		r.backend, r.ownBack = b, true
	}
	r.direct = direct
	if staged {
		r.st = &staging{}
	}
	if err := r.allocate(); err != nil {
		r.release()
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	reg, err := registryOf(w)
	if err != nil {
		r.release()
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	r.reg = reg
	if ro == sender {
		if r.ack, err = reg.newAckSlot(); err != nil {
			r.release()
			return nil, fmt.Errorf("%s: ack word: %w", op, err)
		}
	}
	reg.add(r)
	// The hook also runs when the application closes the endpoint (ErrClosed): nothing
	// more reaches the peer through it, and the iteration in flight ends.
	r.dropFailureHook = p.Peer.OnFailure(func(_ *ucp.Endpoint, err error) { r.fail(err) })
	return r, nil
}

const maxPartitions = 1 << 20

// allocate registers the buffer and makes this side's words.
func (r *Request) allocate() error {
	if r.st != nil {
		if err := r.allocStaging(); err != nil {
			return err
		}
	} else if r.direct {
		m, err := r.w.Context().MemMapPtr(ptrOf(r.buf), len(r.buf), ucp.MemoryCUDA)
		if err != nil {
			return err
		}
		r.memh, r.ownMemh = m, true
	} else if r.memh == nil {
		m, err := r.w.Context().MemMap(r.buf)
		if err != nil {
			return err
		}
		r.memh, r.ownMemh = m, true
	}
	if r.role == sender {
		words, err := r.w.NewSignals(r.backend, r.parts)
		if err != nil {
			return err
		}
		r.words = words
		r.readied = make([]bool, r.parts)
		if r.sentWord, err = r.backend.AllocWords(1); err != nil {
			return err
		}
		if r.st == nil && !r.direct {
			iters, err := r.w.Context().MemAlloc(8 * r.parts)
			if err != nil {
				return err
			}
			r.iters = iters
		}
	}
	return nil
}

// release frees what the request holds.
func (r *Request) release() {
	r.st.close()
	if r.sentWord != nil {
		_ = r.sentWord.Close()
	}
	if r.words != nil {
		_ = r.words.Close()
	}
	if r.ones != nil {
		_ = r.ones.Close()
	}
	if r.iters != nil {
		_ = r.iters.Close()
	}
	if r.ownMemh && r.memh != nil {
		_ = r.memh.Close()
	}
	r.st.freePinned()
	if r.ownBack {
		_ = r.backend.Close()
	}
}

// Worker is the worker the request communicates on.
func (r *Request) Worker() *ucp.Worker {
	if r == nil {
		return nil
	}
	return r.w
}

// Partitions is the request's own number of partitions.
func (r *Request) Partitions() int {
	if r == nil {
		return 0
	}
	return r.parts
}

// Stats reports the request's counters.
func (r *Request) Stats() Stats {
	if r == nil {
		return Stats{}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stats
}

// fail records the peer's failure and releases whatever waits on the request: streams
// waiting on the receiver's arrival counters or the sender's ready flags, graphs, host
// waiters.
func (r *Request) fail(err error) {
	r.mu.Lock()
	if r.freed {
		r.mu.Unlock() // its words are gone; nothing waits on a freed request
		return
	}
	if r.err == nil {
		r.err = fmt.Errorf("prepared %s tag %#x: %w", r.role, r.tag, err)
	}
	// Under r.mu, so Free cannot release the words meanwhile. failedWord satisfies a
	// receiver stream's GEQ wait and a sender stream's GEQ 1 wait, so no stream stays
	// blocked on a dead peer.
	r.storeFailedLocked()
	hold := r.clearingNodes || (r.dev != nil && r.dev.direct)
	r.mu.Unlock()
	r.failDevice()
	if hold {
		go r.holdFailed()
	}
}

// holdFailed keeps the failure value in a failed sender's ready flags until Free: a
// CUDA graph's gate (direct or not) clears its flag at every launch and a direct
// kernel marks it moved, and each later launch must still find the failure value
// instead of waiting for a receiver that is gone.
func (r *Request) holdFailed() {
	for {
		time.Sleep(time.Millisecond)
		r.mu.Lock()
		if r.freed {
			r.mu.Unlock()
			return
		}
		for i := range r.words.Len() {
			if v := r.words.Word(i).Load(); v == 0 || v&movedBit != 0 {
				r.words.Word(i).Store(failedWord)
			}
		}
		r.mu.Unlock()
	}
}

// failedWord is stored into a request's words when its peer failed: far above any
// iteration (a GEQ wait, which compares wrap-aware, holds: on a ready flag GEQ 1, on
// an arrival counter GEQ the iteration) and odd (an AND 1 wait holds).
const failedWord = 1<<62 | 1

// movedBit marks a direct-path sender's ready flag once a kernel moved the
// partition (UCPX_PART_MOVED | iteration, device/ucpx_signal.cuh).
const movedBit = 1 << 63

// readyValue reports whether a ready flag holds an iteration (not 0, not failedWord,
// not moved).
func readyValue(v uint64) bool { return v != 0 && v != failedWord && v&movedBit == 0 }

// movedLocked reports whether a kernel moved every partition of the current iteration
// on the direct path: each flag holds movedBit|iteration, or already a later iteration
// the receiver started after seeing it. A partition seen moved stays so for the
// iteration: it resumes where the last call stopped (nlanded). Caller holds r.mu.
func (r *Request) movedLocked() bool {
	for ; r.nlanded < r.parts; r.nlanded++ {
		v := r.words.Word(r.nlanded).Load()
		if v != movedBit|r.iter && (!readyValue(v) || int64(v-r.iter) <= 0) {
			return false
		}
	}
	return true
}

// takeReady takes a ready flag that holds an iteration (stores 0).
func takeReady(flag *stream.Word) bool {
	v := flag.Load()
	return readyValue(v) && flag.CompareAndSwap(v, 0)
}

// errLocked is the request's sticky error. Caller holds r.mu.
func (r *Request) errLocked() error {
	if r.freed {
		return fmt.Errorf("prepared %s: freed: %w", r.role, ErrClosed)
	}
	return r.err
}

// partRange is the byte range of partition p of n over len(buf) bytes.
func partRange(total, n, p int) (off, size int) {
	size = total / n
	return p * size, size
}

// Start begins an iteration (MPI_Start). The first Start runs the prepare phase if
// PrepareAll did not, and like a receive with no deadline it then waits until the
// peer's matching request exists (a dead peer ends it with ErrPeerFailed); call
// PrepareAll with a context first to bound that wait. Once the peer failed or the
// request's endpoint or worker closed, Start fails at once with that error. A receiver's Start tells the
// sender, with one RDMA write, that it may move every partition of this iteration.
// Start while the previous iteration is incomplete (not yet seen done by Wait or
// Test) fails with ErrInvalidParam.
func (r *Request) Start() error {
	if r == nil {
		return fmt.Errorf("start: nil request: %w", ErrInvalidParam)
	}
	if err := r.ensurePrepared(); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.errLocked(); err != nil {
		return err
	}
	if r.active {
		return fmt.Errorf("start: iteration %d is not complete: %w", r.iter, ErrInvalidParam)
	}
	if r.role == sender && len(r.nodes) > 0 {
		// Its graphs' launches are its iterations, which this side does not count: a
		// host iteration after them would tell the receiver an older one.
		return fmt.Errorf("start: the sender's partitions are made ready by PreadyNode: it iterates by its graphs' launches: %w", ErrInvalidParam)
	}
	r.iter++
	r.active = true
	r.iterErr = nil
	r.nlanded = 0
	if r.role == sender {
		clear(r.readied)
		r.nready = 0
		r.waiting = r.waiting[:0]
		r.inflight = r.inflight[:0]
		return nil
	}
	// One write sets every ready flag of the sender to the iteration (a graph's copy
	// of the flag is how its relaunch tells the iteration: direct.go). The last
	// iteration's write completed before that iteration did.
	src := r.ones.Bytes()[:8*r.remote.parts]
	for i := 0; i < len(src); i += 8 {
		*(*uint64)(unsafe.Pointer(&src[i])) = r.iter
	}
	req, err := r.peer.PutNbx(src, r.remote.wordBase, r.remote.wordKey, &ucp.RequestParam{MemH: r.ones})
	if err != nil {
		r.active = false
		r.iter--
		return fmt.Errorf("start: publish readiness: %w", err)
	}
	r.readyReq = req
	if r.st != nil {
		if err := r.landLocked(); err != nil {
			// The readiness went out: the sender will move this iteration, but it cannot
			// land. The request can run no more iterations.
			r.err = fmt.Errorf("prepared %s tag %#x: start: land partitions: %w", r.role, r.tag, err)
			return r.err
		}
	}
	return nil
}

// StartAll starts each request (MPI_Startall), after one prepare phase for all of
// them if they were not prepared yet (which waits as Start's does).
func StartAll(reqs ...*Request) error {
	if err := PrepareAll(context.Background(), reqs...); err != nil {
		return err
	}
	for _, r := range reqs {
		if err := r.Start(); err != nil {
			return err
		}
	}
	return nil
}

// ensurePrepared runs the prepare phase for r alone if it has not run.
func (r *Request) ensurePrepared() error {
	if r.isPrepared() {
		return nil
	}
	return PrepareAll(context.Background(), r)
}

// Pready marks partition p ready (MPI_Pready): it moves as soon as the receiver is
// ready for this iteration, without the caller waiting and without further calls
// (the worker's registry moves partitions whose readiness lands later). Errors at the call: p out of
// range, p already ready in this iteration, no iteration started.
func (r *Request) Pready(p int) error { return r.PreadyList([]int{p}) }

// PreadyRange marks partitions lo through hi (inclusive) ready.
func (r *Request) PreadyRange(lo, hi int) error {
	if r == nil {
		return fmt.Errorf("pready range: nil request: %w", ErrInvalidParam)
	}
	if lo > hi || lo < 0 || hi >= r.parts {
		// Checked before the list is made: a range of the whole int line is no list.
		return fmt.Errorf("pready range [%d, %d] of %d partitions: %w", lo, hi, r.parts, ErrInvalidParam)
	}
	ps := make([]int, 0, hi-lo+1)
	for p := lo; p <= hi; p++ {
		ps = append(ps, p)
	}
	return r.PreadyList(ps)
}

// PreadyList marks the listed partitions ready. Nothing is marked if any is invalid.
func (r *Request) PreadyList(ps []int) error {
	if r == nil {
		return fmt.Errorf("pready: nil request: %w", ErrInvalidParam)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.checkPreadyLocked("pready", ps); err != nil {
		return err
	}
	if r.st != nil {
		// Each partition's copy to the host copy runs on one of the request's streams,
		// behind its ready flag, and triggers its put.
		for _, p := range ps {
			if err := r.preadyOnStreamLocked(r.st.streamFor(p), p); err != nil {
				return fmt.Errorf("pready: %w", err)
			}
		}
		return nil
	}
	for _, p := range ps {
		r.markReadyLocked(p)
		r.waiting = append(r.waiting, p)
	}
	err := r.pumpLocked()
	if len(r.waiting) > 0 && r.awaiting != r.iter {
		// They move when the receiver's readiness lands, whatever the caller does next.
		r.awaiting = r.iter
		r.reg.awaitReady(r, r.iter)
	}
	return err
}

// markReadyLocked records that partition p was made ready in this iteration.
func (r *Request) markReadyLocked(p int) {
	r.readied[p] = true
	r.nready++
}

// checkPreadyLocked validates partitions for a Pready of the current iteration.
func (r *Request) checkPreadyLocked(op string, ps []int) error {
	if r.role != sender {
		return fmt.Errorf("%s on a receive request: %w", op, ErrInvalidParam)
	}
	if err := r.errLocked(); err != nil {
		return err
	}
	if !r.active {
		return fmt.Errorf("%s before Start: %w", op, ErrInvalidParam)
	}
	var seen map[int]bool
	if len(ps) > 1 {
		seen = make(map[int]bool, len(ps))
	}
	for _, p := range ps {
		switch {
		case p < 0 || p >= r.parts:
			return fmt.Errorf("%s: partition %d of %d: %w", op, p, r.parts, ErrInvalidParam)
		case r.readied[p] || seen[p]:
			return fmt.Errorf("%s: partition %d already ready in iteration %d: %w", op, p, r.iter, ErrInvalidParam)
		}
		if seen != nil {
			seen[p] = true
		}
	}
	return nil
}

// pumpLocked moves every waiting partition whose ready flag the receiver has set. A
// put refused at issue fails the iteration (it completes with that error: the
// partition's flag was taken, so it cannot move in this iteration any more) and is
// also returned. Caller holds r.mu.
func (r *Request) pumpLocked() error {
	// The receiver's Start sets every flag with one write: while the first waiting
	// partition's flag is unset, so are the others', and there is nothing to scan.
	if len(r.waiting) == 0 || !readyValue(r.words.Word(r.waiting[0]).Load()) {
		return nil
	}
	kept, taken := r.waiting[:0], r.taken[:0]
	for _, p := range r.waiting {
		if takeReady(r.words.Word(p)) {
			taken = append(taken, p)
		} else {
			kept = append(kept, p)
		}
	}
	r.waiting, r.taken = kept, taken
	slices.Sort(taken)
	var first error
	for i := 0; i < len(taken); {
		j := i + 1
		for j < len(taken) && taken[j] == taken[j-1]+1 {
			j++
		}
		if err := r.moveRunLocked(taken[i], taken[j-1]); err != nil {
			err = fmt.Errorf("pready: partitions %d to %d: %w", taken[i], taken[j-1], err)
			if r.iterErr == nil {
				r.iterErr = err
			}
			if first == nil {
				first = err
			}
		}
		i = j
	}
	return first
}

// moveRunLocked moves partitions lo through hi, whose flags it took. One partition is
// one put-with-signal. A longer run moves as one put of its bytes, a fence and one put
// of the iteration into its arrival counters (what the counters' adds would give):
// partitions that became movable together, such as every partition made ready before
// the receiver's readiness arrived, cost two operations instead of three each.
// Caller holds r.mu.
func (r *Request) moveRunLocked(lo, hi int) error {
	if lo < hi && (r.direct || r.remote.bufKey.Device()) {
		// A copy on a stream (into a mapped device buffer, or ucp's staging of this
		// side's device buffer) and a UCX put of the counters are not ordered by a
		// fence: each partition is one put-with-signal, which orders its own two.
		for p := lo; p <= hi; p++ {
			if err := r.moveRunLocked(p, p); err != nil {
				return err
			}
		}
		return nil
	}
	if lo == hi {
		req, err := r.putLocked(lo, nil, false)
		if err != nil {
			return err
		}
		r.inflight = append(r.inflight, req)
		return nil
	}
	size := len(r.xfer) / r.parts
	off, n := lo*size, (hi-lo+1)*size
	data, err := r.peer.PutNbx(r.xfer[off:off+n], r.remote.bufBase+uint64(off), r.remote.bufKey, &ucp.RequestParam{MemH: r.memh})
	if err != nil {
		return err
	}
	r.inflight = append(r.inflight, data)
	if err := r.w.Fence(); err != nil {
		return err
	}
	// The run's source words: the last put that read them ended with its iteration.
	src := r.iters.Bytes()[8*lo : 8*(hi+1)]
	for i := 0; i < len(src); i += 8 {
		*(*uint64)(unsafe.Pointer(&src[i])) = r.iter
	}
	words, err := r.peer.PutNbx(src, r.remote.wordBase+8*uint64(lo), r.remote.wordKey, &ucp.RequestParam{MemH: r.iters})
	if err != nil {
		return err
	}
	r.inflight = append(r.inflight, words)
	r.stats.Puts += uint64(hi - lo + 1)
	return nil
}

// putLocked moves partition p (with rp's condition, if any) and counts its arrival at
// the receiver. A put armed once and run at every launch of a graph (relaunched)
// adds 1 to the counter; the others store the iteration, which needs no atomic at the
// receiver. Caller holds r.mu (or owns r during setup).
func (r *Request) putLocked(p int, rp *ucp.RequestParam, relaunched bool) (*ucp.Request, error) {
	off, size := partRange(len(r.xfer), r.parts, p)
	param := ucp.RequestParam{MemH: r.memh}
	if rp != nil {
		param.Condition, param.Flags = rp.Condition, rp.Flags
	}
	// The arrival counter after iteration i is i: stored with a put (SignalStore),
	// no atomic.
	sig := ucp.Signal{Op: ucp.SignalStore, Value: r.iter, Addr: r.remote.wordBase + 8*uint64(p), Rkey: r.remote.wordKey}
	if relaunched {
		sig.Op, sig.Value = ucp.SignalAdd, 1
	}
	req, err := r.peer.PutSignalNbx(r.xfer[off:off+size], r.remote.bufBase+uint64(off), r.remote.bufKey, sig, &param)
	if err == nil {
		r.stats.Puts++
	}
	return req, err
}

// PreadyOnStream marks partition p ready when stream s gets here: the stream waits for
// the receiver's readiness, then the engine moves the partition; later work on s does
// not wait for the transfer. s must be of the request's backend. For a device buffer
// the partition's copy to the host copy runs on s too, after the wait.
func (r *Request) PreadyOnStream(s stream.Stream, p int) error {
	if r == nil {
		return fmt.Errorf("pready on stream: nil request: %w", ErrInvalidParam)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.checkPreadyLocked("pready on stream", []int{p}); err != nil {
		return err
	}
	if s == nil || s.Kind() != r.backend.Kind() {
		return fmt.Errorf("pready on stream: the stream is not of the request's backend: %w", ErrInvalidParam)
	}
	if err := r.preadyOnStreamLocked(s, p); err != nil {
		return fmt.Errorf("pready on stream: %w", err)
	}
	return nil
}

// streamCondLocked is the request's Stream condition on s, made on first use.
func (r *Request) streamCondLocked(s stream.Stream) (*condition.Condition, error) {
	if cond := r.streamConds[s]; cond != nil {
		return cond, nil
	}
	c, err := condition.Create(condition.Param{Category: condition.Stream, Backend: r.backend, Stream: s})
	if err != nil {
		return nil, err
	}
	r.streamConds[s] = c
	return c, nil
}

// preadyOnStreamLocked enqueues on s: wait for partition p's ready flag (or the
// failure value), take it, copy a staged partition to the host copy, trigger the
// put. Caller holds r.mu and checked p.
func (r *Request) preadyOnStreamLocked(s stream.Stream, p int) error {
	cond, err := r.streamCondLocked(s)
	if err != nil {
		return err
	}
	r.streams.Add(s)
	flag := r.words.Word(p)
	// GEQ 1: released by the iteration and by the failure value.
	if err := s.WaitValue(flag, 1, stream.GEQ); err != nil {
		return err
	}
	if err := s.WriteValue(flag, 0); err != nil {
		return err
	}
	if r.st != nil {
		if err := r.copyOut(s, p); err != nil {
			return err
		}
	}
	req, err := r.putLocked(p, &ucp.RequestParam{Condition: cond, Flags: ucp.NonBlockingEnqueue}, false)
	if err != nil {
		return err
	}
	r.markReadyLocked(p)
	r.inflight = append(r.inflight, req)
	return nil
}

// Parrived reports whether partition p of the current iteration has arrived
// (MPI_Parrived). It progresses the worker once. A dead peer gives ucp.ErrPeerFailed.
func (r *Request) Parrived(p int) (bool, error) {
	if r == nil {
		return false, fmt.Errorf("parrived: nil request: %w", ErrInvalidParam)
	}
	r.mu.Lock()
	if r.role != receiver {
		r.mu.Unlock()
		return false, fmt.Errorf("parrived on a send request: %w", ErrInvalidParam)
	}
	if p < 0 || p >= r.parts {
		r.mu.Unlock()
		return false, fmt.Errorf("parrived: partition %d of %d: %w", p, r.parts, ErrInvalidParam)
	}
	if err := r.errLocked(); err != nil {
		r.mu.Unlock()
		return false, err
	}
	if r.iter == 0 {
		r.mu.Unlock()
		return false, fmt.Errorf("parrived before Start: %w", ErrInvalidParam)
	}
	ok, _ := r.landed(p)
	r.mu.Unlock()
	if ok {
		return true, nil
	}
	r.w.Progress()
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.errLocked(); err != nil {
		return false, err
	}
	ok, failed := r.landed(p)
	if failed {
		return false, fmt.Errorf("parrived: partition %d: %w", p, ucp.ErrPeerFailed)
	}
	return ok, nil
}

// senderParts is the range of the sender's partitions that cover receive partition q.
func (r *Request) senderParts(q int) (first, last int) {
	off, size := partRange(len(r.buf), r.parts, q)
	ssize := len(r.buf) / r.remote.parts
	return off / ssize, (off + size - 1) / ssize
}

// ArrivedOnStream holds back later work on s until partition p of the current
// iteration has arrived (or the peer failed).
func (r *Request) ArrivedOnStream(s stream.Stream, p int) error {
	if r == nil {
		return fmt.Errorf("arrived on stream: nil request: %w", ErrInvalidParam)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.errLocked(); err != nil {
		return err // freed (ErrClosed) or failed, before what it was asked
	}
	switch {
	case r.role != receiver:
		return fmt.Errorf("arrived on stream on a send request: %w", ErrInvalidParam)
	case p < 0 || p >= r.parts:
		return fmt.Errorf("arrived on stream: partition %d of %d: %w", p, r.parts, ErrInvalidParam)
	case !r.active:
		return fmt.Errorf("arrived on stream before Start: %w", ErrInvalidParam)
	case s == nil || s.Kind() != r.backend.Kind():
		return fmt.Errorf("arrived on stream: the stream is not of the request's backend: %w", ErrInvalidParam)
	}
	r.streams.Add(s)
	if r.st != nil {
		if err := s.WaitValue(r.st.landed.Word(p), r.iter, stream.GEQ); err != nil {
			return fmt.Errorf("arrived on stream: %w", err)
		}
		return nil
	}
	first, last := r.senderParts(p)
	for sp := first; sp <= last; sp++ {
		if err := s.WaitValue(r.words.Word(sp), r.iter, stream.GEQ); err != nil {
			return fmt.Errorf("arrived on stream: %w", err)
		}
	}
	return nil
}

// Test reports whether the current iteration completed: on a sender every partition
// was made ready and moved (the buffer may be reused), on a receiver every partition
// arrived. It progresses the worker once.
func (r *Request) Test() (bool, error) {
	if r == nil {
		return false, fmt.Errorf("test: nil request: %w", ErrInvalidParam)
	}
	r.w.Progress()
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.testLocked()
}

func (r *Request) testLocked() (bool, error) {
	if err := r.errLocked(); err != nil {
		r.active = false
		return true, err
	}
	if !r.active {
		return true, nil
	}
	if r.role == sender {
		if err := r.pumpLocked(); err != nil {
			return false, err
		}
		if !r.sentLocked() {
			return false, nil
		}
		r.signalSentLocked()
		if r.iterErr == nil && len(r.inflight) > 0 && int64(r.ack.load()-r.iter) < 0 {
			r.reg.drain(r, r.iter)
		}
		first := r.iterErr
		for _, req := range r.inflight {
			if err := req.Err(); err != nil && first == nil {
				first = err
			}
		}
		r.active = false
		r.stats.Iterations++
		return true, first
	}
	if r.readyReq != nil && !r.readyReq.Done() {
		return false, nil
	}
	// A partition that landed stays so for the iteration: resume where the last
	// Test stopped instead of looking at every partition again.
	for ; r.nlanded < r.parts; r.nlanded++ {
		if ok, _ := r.landed(r.nlanded); !ok {
			return false, nil
		}
	}
	var err error
	if r.readyReq != nil {
		err = r.readyReq.Err()
	}
	if err == nil && r.ackIter != r.iter {
		if r.ackReq != nil && !r.ackReq.Done() {
			return false, nil // the last ack still reads its source word
		}
		if err = r.ackLocked(); err == nil {
			r.ackIter = r.iter
		}
	}
	if err == nil && !r.ackReq.Done() {
		// Done once UCX sent it: a receiver that stops progressing after Wait must not
		// keep the ack in its queue.
		return false, nil
	}
	if err == nil {
		err = r.ackReq.Err()
	}
	r.active = false
	r.stats.Iterations++
	return true, err
}

// ackWord: UCX may report a put-with-signal complete while its signal still waits in
// the sender's queue (behind the fence) for a later progress call, so a sender that
// stopped progressing after its Wait would leave the receiver waiting. The receiver
// therefore writes each iteration it completed into the sender's ack word, and a
// sender iteration that completed (its buffer may be reused, as MPI's send
// completion) before its ack came is handed to the registry's drainer, which
// progresses the worker, parked on its event fd between rounds, until the ack arrives
// (registry.drain). The receiver's Wait returns once its ack was sent. The ack word is
// a slot of the worker's registry, never reused and never freed, so an ack that lands
// after the sender was freed writes into no one else's memory.

// ackLocked writes the completed iteration into the sender's ack word. Caller holds
// r.mu.
func (r *Request) ackLocked() error {
	src := r.ones.Bytes()[8*r.remote.parts:]
	*(*uint64)(unsafe.Pointer(&src[0])) = r.iter
	req, err := r.peer.PutNbx(src[:8], r.remote.ackBase, r.remote.ackKey, &ucp.RequestParam{MemH: r.ones})
	if err != nil {
		return fmt.Errorf("acknowledge iteration %d: %w", r.iter, err)
	}
	r.ackReq = req
	return nil
}

// Wait waits until the current iteration completed (see Test) or ctx ends. It drives
// the worker's progress itself.
func (r *Request) Wait(ctx context.Context) error {
	if r == nil {
		return fmt.Errorf("wait: nil request: %w", ErrInvalidParam)
	}
	if ctx == nil {
		return fmt.Errorf("wait: nil context: %w", ErrInvalidParam)
	}
	start := time.Now()
	for i := 0; ; i++ {
		done, err := r.Test()
		if done {
			return err
		}
		if i&63 == 63 {
			if err := ctx.Err(); err != nil {
				return err
			}
			// Arrivals are one-sided writes (by UCX or a GPU) that wake nobody: spin
			// first, then sleep on the worker's events, which still wake at once for
			// what UCX does deliver.
			backoff.PauseOn(start, func() { _ = r.w.WaitForEvents(ctx, time.Millisecond) })
		}
	}
}

// WaitOnStream holds back later work on s until the current iteration completed: on a
// receiver, until every partition arrived; on a sender, until every partition was made
// ready (in any form, also after this call) and moved, so that the buffer may be
// reused. A sender's stream is released without further host calls: the worker's
// registry watches the iteration (and a dead peer releases it too). On a sender with
// no iteration in flight it returns at once; s must be of the request's backend.
func (r *Request) WaitOnStream(s stream.Stream) error {
	if r == nil {
		return fmt.Errorf("wait on stream: nil request: %w", ErrInvalidParam)
	}
	if r.role == receiver {
		r.mu.Lock()
		parts := r.parts
		r.mu.Unlock()
		for p := range parts {
			if err := r.ArrivedOnStream(s, p); err != nil {
				return err
			}
		}
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if s == nil || s.Kind() != r.backend.Kind() {
		return fmt.Errorf("wait on stream: the stream is not of the request's backend: %w", ErrInvalidParam)
	}
	if err := r.errLocked(); err != nil {
		return err
	}
	if !r.active {
		return nil
	}
	_ = r.pumpLocked() // a refused put fails the iteration, which Wait reports
	if r.sentLocked() {
		r.signalSentLocked()
		return nil
	}
	if len(r.waiting) == 0 && r.nready == r.parts && !r.kernelMovesLocked() {
		// Every partition's operation is issued: the stream waits for each in its own
		// way (a GPU stream on the operation's completion word), with no host poll.
		for _, req := range r.inflight {
			if err := req.WaitOnStream(s); err != nil {
				return fmt.Errorf("wait on stream: %w", err)
			}
		}
		return nil
	}
	r.streams.Add(s)
	if err := s.WaitValue(r.sentWord.Word(0), r.iter, stream.GEQ); err != nil {
		return fmt.Errorf("wait on stream: %w", err)
	}
	if r.sentWatched != r.iter {
		r.sentWatched = r.iter
		r.reg.watchSent(r, r.iter)
	}
	return nil
}

// sentLocked reports whether every partition of the sender's current iteration was
// made ready and moved: its buffer may be reused. Caller holds r.mu.
func (r *Request) sentLocked() bool {
	return r.nready == r.parts && r.readiedMovedLocked() &&
		(!r.kernelMovesLocked() || r.iterErr != nil || r.movedLocked())
}

// readiedMovedLocked reports whether every partition made ready so far has left (none
// waits for the receiver's readiness) and the operations that moved them completed.
// Caller holds r.mu.
func (r *Request) readiedMovedLocked() bool {
	if len(r.waiting) > 0 {
		return false
	}
	for _, req := range r.inflight {
		if !req.Done() {
			return false
		}
	}
	return true
}

// kernelMovesLocked reports whether kernels move this iteration's partitions (the
// direct path's DeviceHandle), each marking its flag once it did. Caller holds r.mu.
func (r *Request) kernelMovesLocked() bool {
	d := r.dev
	return d != nil && d.direct && d.armed == r.iter
}

// signalSentLocked releases the streams waiting (WaitOnStream) for the current
// iteration's partitions to move. Caller holds r.mu.
func (r *Request) signalSentLocked() {
	// Only WaitOnStream's wait reads the word, and it watches the iteration it waits
	// for (earlier ones were signalled when they completed, or failed).
	if r.sentWatched != r.iter {
		return
	}
	if r.sentWord != nil && r.sentWord.Word(0).Load() != failedWord {
		r.sentWord.Word(0).Store(r.iter)
		r.sentWord.Notify()
	}
}

// Free releases the request (MPI_Request_free). It either releases the request and
// returns nil, or fails and changes nothing (the request stays as it was; Free may be
// called again): with ErrBusy while an iteration is in flight, or, after a failure,
// while an operation of the request has not completed because a stream has yet to
// reach it (a PreadyOnStream queued behind work the stream still runs: the stream
// ends it when it gets there, which Free does not wait for); with ErrClosed once
// freed.
//
// An iteration in flight ends when it completes, when the peer fails (it completes
// with the failure, matching ucp.ErrPeerFailed) or when the request's endpoint or
// worker closes (ErrClosed; a live peer that never does its part is left this way).
// Memory a peer may still write into is
// never released under it. Before it answers ErrBusy, Free progresses the worker once
// and looks at the endpoint, as a Wait would: a peer failure UCX noticed ends the
// iteration there, so a request whose peer died is freed by Free alone (retried until
// UCX notices), with no Wait or Test first.
//
// Streams given a wait or work on the request (WaitOnStream, ArrivedOnStream,
// PreadyOnStream) may not have got to it yet, satisfied as it is: the request's words,
// registrations and host copy are freed only once each such stream passed it, on host
// streams in stream order without blocking Free, on CUDA streams by synchronizing
// them, as cudaFree does. Kernels and graph launches that use the request
// (DeviceHandle, PreadyNode) must have completed before Free.
func (r *Request) Free() error {
	if r == nil {
		return fmt.Errorf("free: nil request: %w", ErrInvalidParam)
	}
	// Operations a failure left behind retire soon once their stream got to them; one
	// behind work its stream still runs may wait for as long as the caller holds the
	// stream back, which Free must not.
	deadline := time.Now().Add(retireWait)
	var heldSince time.Time
	looked := false
	for {
		r.mu.Lock()
		if r.freed {
			r.mu.Unlock()
			return fmt.Errorf("free: %w", ErrClosed)
		}
		if r.active && r.err == nil {
			iter := r.iter
			r.mu.Unlock()
			if !looked {
				looked = true
				r.noticeFailure()
				continue
			}
			return fmt.Errorf("free: iteration %d in flight (it ends when it completes, the peer fails, or the endpoint or worker closes): %w", iter, ErrBusy)
		}
		c, n := r.pendingCondLocked()
		if c == nil {
			break // with r.mu: nothing arms a condition of r meanwhile
		}
		r.mu.Unlock()
		now := time.Now()
		if s := c.Stream(); s != nil && streamRunning(s) {
			if heldSince.IsZero() {
				heldSince = now
			}
		} else {
			heldSince = time.Time{}
		}
		if now.After(deadline) || (!heldSince.IsZero() && now.Sub(heldSince) > heldGrace) {
			return fmt.Errorf("free: %d operation(s) not completed: %w", n, ErrBusy)
		}
		if r.w.Progress() == 0 {
			time.Sleep(20 * time.Microsecond)
		}
	}
	r.freed = true
	// Operations that read or write the request's registered memory: the ack write
	// (it reads r.ones), puts and the readiness write an iteration that failed left
	// behind (a dead peer's endpoint fails them soon). They leave, bounded, before that
	// memory is deregistered and freed.
	pending := append([]*ucp.Request{r.ackReq, r.readyReq}, r.inflight...)
	conds := r.graphConds
	for _, c := range r.streamConds {
		conds = append(conds, c)
	}
	dev := r.dev
	streams := r.streams.Take()
	r.mu.Unlock()
	// From here on nothing is left for a retry: what cannot be released (a graph
	// launch still running its operation) stays allocated rather than freed under it.
	for _, c := range conds {
		_ = destroyCondition(c)
	}
	_ = dev.close()
	deadline = time.Now().Add(time.Second)
	for _, req := range pending {
		for req != nil && !req.Done() && time.Now().Before(deadline) {
			if r.w.Progress() == 0 {
				runtime.Gosched()
			}
		}
	}
	r.reg.remove(r)
	r.dropFailureHook()
	if r.remote.bufKey != nil {
		_ = r.remote.bufKey.Close()
	}
	if r.remote.wordKey != nil {
		_ = r.remote.wordKey.Close()
	}
	if r.remote.ackKey != nil {
		_ = r.remote.ackKey.Close()
	}
	r.releaseAfter(streams)
	return nil
}

// noticeFailure lets a peer failure UCX can see reach r, as a Wait would: one round
// of progress (the endpoint's failure hooks run in it) and the endpoint's own record
// of the failure (its hook may be queued behind another goroutine's progress).
func (r *Request) noticeFailure() {
	r.w.Progress()
	if err := r.peer.Err(); err != nil {
		r.fail(err)
	}
}

// retireWait bounds Free's wait for operations a failure left to retire; heldGrace is
// how long it waits while the stream of one still runs work (it may be held back).
const (
	retireWait = time.Second
	heldGrace  = 100 * time.Millisecond
)

// pendingCondLocked is a condition of the request with operations not yet retired, if
// any, and how many operations of the request are pending. Caller holds r.mu.
func (r *Request) pendingCondLocked() (*condition.Condition, int) {
	var first *condition.Condition
	n := 0
	count := func(c *condition.Condition) {
		if k := c.Pending(); k > 0 {
			n += k
			if first == nil {
				first = c
			}
		}
	}
	for _, c := range r.streamConds {
		count(c)
	}
	if r.dev != nil {
		for _, c := range r.dev.conds {
			count(c)
		}
	}
	return first, n
}

// releaseAfter releases what the request holds once every stream of streams passed
// the work it was given. A host stream runs a host function in stream order (or drops
// it, and then reads no more); the last to run hands release to a goroutine, as it
// deregisters memory and closes streams, which must not hold up a stream's executor.
// CUDA host functions may not call CUDA: the streams are synchronized instead, as
// cudaFree does.
func (r *Request) releaseAfter(streams []stream.Stream) {
	if r.backend.Kind() != stream.KindHost {
		for _, s := range streams {
			_ = s.Synchronize() // a stream that failed or closed runs nothing more
		}
		r.release()
		return
	}
	// On a stream's executor, release (which deregisters memory and closes streams)
	// goes to a goroutine of its own.
	streamcore.AfterPassed(streams, func(onStream bool) {
		if onStream {
			go r.release()
		} else {
			r.release()
		}
	})
}

// streamRunning reports whether s still has work to run.
func streamRunning(s stream.Stream) bool {
	done, err := s.Query()
	return err == nil && !done
}

// handshake is what each side sends its peer in the prepare phase.
type handshake struct {
	role     role
	tag      uint64
	index    uint32
	parts    uint32
	length   uint64
	base     uint64 // receiver: buffer address
	wordBase uint64 // sender: ready flags; receiver: arrival counters
	bufKey   []byte // receiver: buffer key
	wordKey  []byte
	ackBase  uint64 // sender: its ack word
	ackKey   []byte
}

const handshakeMagic = 0x75637078_70726570 // "ucpxprep"

// size is about what h holds in memory.
func (h *handshake) size() int { return 64 + len(h.bufKey) + len(h.wordKey) + len(h.ackKey) }

func (h *handshake) marshal() []byte {
	b := binary.LittleEndian.AppendUint64(nil, handshakeMagic)
	b = append(b, byte(h.role))
	b = binary.LittleEndian.AppendUint64(b, h.tag)
	b = binary.LittleEndian.AppendUint32(b, h.index)
	b = binary.LittleEndian.AppendUint32(b, h.parts)
	b = binary.LittleEndian.AppendUint64(b, h.length)
	b = binary.LittleEndian.AppendUint64(b, h.base)
	b = binary.LittleEndian.AppendUint64(b, h.wordBase)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(h.bufKey)))
	b = append(b, h.bufKey...)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(h.wordKey)))
	b = append(b, h.wordKey...)
	b = binary.LittleEndian.AppendUint64(b, h.ackBase)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(h.ackKey)))
	return append(b, h.ackKey...)
}

// unmarshalHandshake decodes a peer's bytes; anything malformed is refused.
func unmarshalHandshake(b []byte) (handshake, error) {
	var h handshake
	bad := fmt.Errorf("malformed prepare handshake (%d bytes): %w", len(b), ErrInvalidParam)
	const fixed = 8 + 1 + 8 + 4 + 4 + 8 + 8 + 8
	if len(b) < fixed+4 || binary.LittleEndian.Uint64(b) != handshakeMagic {
		return h, bad
	}
	h.role = role(b[8])
	h.tag = binary.LittleEndian.Uint64(b[9:])
	h.index = binary.LittleEndian.Uint32(b[17:])
	h.parts = binary.LittleEndian.Uint32(b[21:])
	h.length = binary.LittleEndian.Uint64(b[25:])
	h.base = binary.LittleEndian.Uint64(b[33:])
	h.wordBase = binary.LittleEndian.Uint64(b[41:])
	rest := b[fixed:]
	key := func() ([]byte, bool) {
		if len(rest) < 4 {
			return nil, false
		}
		n := binary.LittleEndian.Uint32(rest)
		if uint64(n) > uint64(len(rest)-4) {
			return nil, false
		}
		k := append([]byte(nil), rest[4:4+n]...)
		rest = rest[4+n:]
		return k, true
	}
	var ok bool
	if h.bufKey, ok = key(); !ok {
		return h, bad
	}
	if h.wordKey, ok = key(); !ok || len(rest) < 8 {
		return h, bad
	}
	h.ackBase = binary.LittleEndian.Uint64(rest)
	rest = rest[8:]
	if h.ackKey, ok = key(); !ok || len(rest) != 0 {
		return h, bad
	}
	if (h.role != sender && h.role != receiver) || h.parts > maxPartitions {
		return h, bad
	}
	if h.parts == 0 && (len(h.bufKey) != 0 || len(h.wordKey) != 0 || len(h.ackKey) != 0) {
		return h, bad // a refusal carries no keys
	}
	return h, nil
}

// refusal is the handshake that answers one r could not take: no partitions, no keys,
// and r's own buffer length, so the peer fails its request (and the streams waiting on
// it) with the reason instead of resending until its context ends.
func (r *Request) refusal() handshake {
	return handshake{role: r.role, tag: r.tag, index: uint32(r.index), length: uint64(len(r.buf))}
}

// freedRefusal is the refusal that answers a handshake naming a freed request of role
// ro: length 0 (no request has an empty buffer), which the peer's request fails with
// ErrCanceled.
func freedRefusal(ro role, tag uint64, index int) handshake {
	return handshake{role: ro, tag: tag, index: uint32(index)}
}

// refused reports whether h is a refusal.
func (h *handshake) refused() bool { return h.parts == 0 }
