package ucp

import (
	"errors"
	"fmt"
	"sync/atomic"
	"unsafe"

	"github.com/ucpx/ucpx/protocol"
	"github.com/ucpx/ucpx/stream/streamcore"
)

// SignalOp says how PutSignalNbx updates the remote signal word.
type SignalOp int

const (
	// SignalSet stores Signal.Value into the word.
	SignalSet SignalOp = iota + 1
	// SignalAdd adds Signal.Value to the word.
	SignalAdd
	// SignalStore writes Signal.Value into the word with an 8-byte put after the data:
	// no atomic operation, and nothing comes back. Where a transport reaches the
	// word's memory directly (memory UCX allocated, over shared memory) nothing of the
	// peer's runs for it; UCX 1.13 here emulates small puts into other memory (C
	// memory, host-mapped pinned words) with active messages that the peer's progress
	// applies, as it does Set and Add, only with less work. The write is not atomic
	// against the peer's reads or other writers: use it for a word only this sender
	// writes, read as a counter that only grows (a reader that sees the new value, or
	// a torn one between old and new, knows the data landed, since the fence orders
	// the write after the data), as package prepare's arrival words are.
	SignalStore
)

// Signal is the remote 64-bit word a PutSignalNbx updates once its data is in place
// (NVSHMEM's put-with-signal, MPI's partition arrival).
type Signal struct {
	Op    SignalOp
	Value uint64
	// Addr is the word's remote address (8-byte aligned), inside the region Rkey
	// grants: a word of the peer's Signals.
	Addr uint64
	Rkey *Rkey
}

// PutSignalNbx writes buf to raddr in the peer's memory (as PutNbx) and then updates
// the peer's signal word, so that the update becomes visible only after the data: a
// peer (or a stream of the peer) waiting on the word may read the data once it sees
// the value. The Request completes once buf may be reused (local completion, as MPI's
// send completion); the data and the signal land at the peer in that order. Where UCX
// carries out the fence by holding the signal until the data's remote completion
// (shm and tcp here), the signal may still wait in the worker's queue after that and
// leaves on a later progress call: keep progressing the worker (or give it
// WorkerParams.ProgressThread) until the peer has seen the signal, as package prepare
// does with its acknowledgements. With a Condition, both start when it triggers.
// RequestParam.Callback runs once, with the returned Request, after both the data and
// the signal completed (not at all when both completed in place).
func (ep *Endpoint) PutSignalNbx(buf []byte, raddr uint64, rkey *Rkey, sig Signal, p *RequestParam) (*Request, error) {
	const op = "put_signal_nbx"
	if ep == nil {
		return nil, opErr(op, ErrInvalidParam, "nil endpoint")
	}
	p = param(p)
	ipc := (rkey != nil && rkey.ipc != nil) || (sig.Rkey != nil && sig.Rkey.ipc != nil)
	check := p.check
	if ipc {
		check = p.checkCommon // the copy engine moves device memory itself
	}
	if err := check(op, ep.w.ctx); err != nil {
		return nil, err
	}
	if sig.Op != SignalSet && sig.Op != SignalAdd && sig.Op != SignalStore {
		return nil, opErr(op, ErrInvalidParam, "signal op %d", sig.Op)
	}
	if sig.Addr%8 != 0 {
		return nil, opErr(op, ErrInvalidParam, "signal address %#x not 8-byte aligned", sig.Addr)
	}
	if err := rkey.checkRange(op, ep, raddr, len(buf)); err != nil {
		return nil, err
	}
	if err := sig.Rkey.checkRange(op, ep, sig.Addr, 8); err != nil {
		return nil, err
	}
	if ep.w.fenceBinds(ipc) {
		if r, ok := ep.w.fenced(op, p, ipc, func(ip *RequestParam) (*Request, error) { return ep.PutSignalNbx(buf, raddr, rkey, sig, ip) }); ok {
			return r, nil
		}
	}
	if ipc {
		return ep.putSignalIPC(op, buf, raddr, rkey, sig, p)
	}
	if p.Condition != nil {
		return ep.w.submit(op, p, buf, protocol.Out, false, func(_ int, b []byte, ip *RequestParam) (*Request, error) {
			return ep.PutSignalNbx(b, raddr, rkey, sig, ip)
		})
	}
	if ep.w.stagesPlain(p) {
		// A device buffer (or StageAlways) to a key UCX moves: through staging, as PutNbx.
		return ep.w.stagedPlain(op, p, buf, protocol.Out, func(b []byte, ip *RequestParam) (*Request, error) {
			return ep.PutSignalNbx(b, raddr, rkey, sig, ip)
		})
	}
	w := ep.w
	w.lockIssue()
	defer w.mu.Unlock()
	if err := ep.usableLocked(op); err != nil {
		return nil, err
	}
	if err := rkey.checkLocked(op, ep, raddr, len(buf)); err != nil {
		return nil, err
	}
	if err := sig.Rkey.checkLocked(op, ep, sig.Addr, 8); err != nil {
		return nil, err
	}
	// The two parts go with part's param: the caller's Callback runs once, with the
	// Request returned, when both are done (join), not once per part.
	part := *p
	var j *signalJoin
	if p.Callback != nil {
		j = &signalJoin{cb: p.Callback}
		part.Callback = j.part
	}
	var data *Request
	pending := int32(0) // parts that went pending: each runs the join once
	if len(buf) > 0 {
		ptr := w.raw.Put(ep.raw, bufPtr(buf), len(buf), raddr, rkey.raw, part.flags(), part.memType(), part.MemH.rawOrNil())
		r, err := w.postLocked(op, ptr, &part, nil, bufPtr(buf))
		if err != nil {
			return nil, opErr(op, unwrapOp(err), "len %d raddr %#x", len(buf), raddr)
		}
		data = r
		switch {
		case !data.done.Load():
			pending++
		case p.staged != nil:
			p.staged(data) // done in place: no completion gives the staging memory back
		}
		// The fence orders the signal after the data at the target.
		if err := statusErr(w.raw.Fence()); err != nil {
			return nil, opErr(op, err, "fence")
		}
	}
	sp := part
	sp.MemoryType, sp.MemH, sp.Request, sp.staged = MemoryHost, nil, nil, nil
	var signal *Request
	var err error
	if sig.Op == SignalStore {
		signal, err = ep.putStoreLocked(op, sig, &sp)
	} else {
		// Add needs no reply: the signal leaves after the data and lands after it, and
		// the caller waits only for what protects buf. Set is a swap, whose reply UCX
		// needs.
		a := AtomicParam{Op: AtomicAdd, Operand: sig.Value, Size: 8}
		if sig.Op == SignalSet {
			a = AtomicParam{Op: AtomicSwap, Operand: sig.Value, Size: 8}
		}
		signal, err = ep.atomicLocked(op, a, sig.Addr, sig.Rkey, &sp)
	}
	if err != nil {
		return nil, err // the join never counts down to the Callback
	}
	if !signal.done.Load() {
		pending++
	}
	// The Request the caller waits on is the signal's while it is pending: the signal
	// must leave before the caller may stop progressing (a peer waits for it), and on
	// one endpoint it leaves after the data (the fence), so the data left too. Else
	// the data's while that is pending, else done.
	r := signal
	if signal.done.Load() && data != nil && !data.done.Load() {
		r = data
	}
	if j != nil {
		// Under w.mu, so before any join runs (they are deferred until it is
		// released). Both parts done in place run none, as UCX's in-place completions.
		j.r = r
		j.left.Store(pending)
	}
	return r, nil
}

// signalJoin runs a PutSignalNbx's Callback with its Request once the last of its
// pending parts completed.
type signalJoin struct {
	left atomic.Int32
	r    *Request
	cb   func(*Request)
}

func (j *signalJoin) part(*Request) {
	if j.left.Add(-1) == 0 {
		j.cb(j.r)
	}
}

// putStoreLocked writes sig.Value into the signal word with a put (SignalStore), after
// the data, with p (host memory, no caller's Request). The value's source is a word of
// its own, kept (pinned) while UCX reads it. Caller holds w.mu.
func (ep *Endpoint) putStoreLocked(op string, sig Signal, p *RequestParam) (*Request, error) {
	w := ep.w
	v := new(uint64)
	*v = sig.Value
	ptr := w.raw.Put(ep.raw, unsafe.Pointer(v), 8, sig.Addr, sig.Rkey.raw, p.flags(), int(MemoryHost), nil)
	signal, err := w.postLocked(op, ptr, p, nil, unsafe.Pointer(v))
	if err != nil {
		return nil, opErr(op, unwrapOp(err), "signal store raddr %#x", sig.Addr)
	}
	return signal, nil
}

// Signals are registered 64-bit signal words that peers update (PutSignalNbx,
// AtomicNbx, PutNbx) and that streams of one backend wait on
// (stream.Stream.WaitValue): C memory on host backends, host-mapped pinned memory on
// CUDA, so both a peer's RMA and the GPU reach them. A host stream waiting on one of
// them drives the worker's progress itself, so a stream waiting for a peer's write
// needs no progress loop of the user's.
type Signals struct {
	w     *Worker
	block *streamcore.WordBlock
	memh  *MemH
}

// NewSignals allocates n zeroed signal words of backend b and registers them.
func (w *Worker) NewSignals(b streamcore.Backend, n int) (*Signals, error) {
	const op = "new_signals"
	if w == nil {
		return nil, opErr(op, ErrInvalidParam, "nil worker")
	}
	if b == nil || n <= 0 {
		return nil, opErr(op, ErrInvalidParam, "backend %v, %d words", b, n)
	}
	if w.closed.Load() {
		return nil, opErr(op, ErrClosed, "")
	}
	block, shared, err := w.allocSignalWords(b, n)
	if err != nil {
		return nil, opErr(op, err, "%d words", n)
	}
	m, err := w.ctx.MemMapPtr(block.Word(0).HostPtr(), 8*n, MemoryHost)
	if err != nil {
		_ = block.Close()
		return nil, err
	}
	m.shared = shared
	block.SetDriver(workerDriver{w})
	return &Signals{w: w, block: block, memh: m}, nil
}

// Len is the number of words.
func (s *Signals) Len() int {
	if s == nil {
		return 0
	}
	return s.block.Len()
}

// Word is word i, for streams to wait on and the host to read.
func (s *Signals) Word(i int) *streamcore.Word {
	if s == nil {
		return nil
	}
	return s.block.Word(i)
}

// Addr is the address a peer's RMA gives for word i (Signal.Addr).
func (s *Signals) Addr(i int) uint64 {
	if s == nil {
		return 0
	}
	return uint64(s.block.Word(i).HostPtr())
}

// PackRkey is the remote key of the words, for UnpackRkey on a peer.
func (s *Signals) PackRkey() ([]byte, error) {
	if s == nil {
		return nil, opErr("rkey_pack", ErrInvalidParam, "nil signals")
	}
	return s.memh.PackRkey()
}

// Close deregisters and frees the words; streams must no longer wait on them. Where
// the registration stays (the revocation timed out: peers that imported the key may
// still write), the words stay too and Close returns that error: close again later.
func (s *Signals) Close() error {
	if s == nil {
		return opErr("signals_close", ErrInvalidParam, "nil signals")
	}
	err := s.memh.Close()
	if errors.Is(err, ErrTimedOut) {
		return fmt.Errorf("signals: %w", err) // still registered: the words stay
	}
	s.block.SetDriver(nil)
	if cerr := s.block.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("signals: %w", err)
	}
	return nil
}

// workerDriver progresses the worker for a host executor waiting on one of its
// signal words (stream.Driver).
type workerDriver struct{ w *Worker }

func (d workerDriver) Drive() bool { return d.w.Progress() > 0 }

func (d workerDriver) Kick() {}

func (d workerDriver) Release() {}
