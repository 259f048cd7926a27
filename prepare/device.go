package prepare

import (
	"errors"
	"fmt"
	"time"

	"github.com/ucpx/ucpx/condition"
	"github.com/ucpx/ucpx/device"
	"github.com/ucpx/ucpx/internal/backoff"
	"github.com/ucpx/ucpx/stream"
	"github.com/ucpx/ucpx/ucp"
)

// The device side of prepared partitions: kernels make partitions ready (ucpx_pready)
// and check their arrival (ucpx_pstatus, ucpx_parrived) in device/ucpx_signal.cuh,
// through a DeviceHandle; PreadyHandle and ParrivedHandle do the same from host
// goroutines (host backends, and the tests of the protocol on host streams).
//
// A sender's partition p has a KernelTriggered condition. DeviceHandle arms the
// iteration's put-with-signal of every partition on its condition (one sequence number
// per iteration), so the put is issued by the engine, on the CPU, once the trigger
// word reaches it. ucpx_pready(h, p) waits until the receiver's Start set ready flag
// p (or the peer failed), takes it (stores 0) and stores the iteration's sequence
// number into p's trigger word, as ucpx_trigger does. The kernel finds the trigger
// words through a table of their addresses (one word per partition, host-mapped on
// CUDA), since each condition has words of its own.

// deviceState is a sender's device-side state, made by the first DeviceHandle.
type deviceState struct {
	conds []*condition.Condition // one KernelTriggered condition per partition
	table *stream.WordBlock      // table[p]: the address of conds[p]'s trigger word
	// Of the iteration armed last: the conditions' handles (Value: what ucpx_pready
	// stores), the puts, and the iteration in which each flag was taken through
	// PreadyHandle.
	armed   uint64
	value   uint64
	handles []condition.DeviceHandle
	reqs    []*ucp.Request
	taken   []uint64
	// kready (staged requests) replaces the conditions: table[p] points at kready[p],
	// into which ucpx_pready stores the iteration; one of the request's streams waits
	// for it, copies the partition to the host copy and triggers the put.
	kready *stream.WordBlock
	// direct: a direct-path sender (direct.go); the kernel moves each partition
	// itself, so there is nothing to arm: no conditions, no table.
	direct bool
}

// DeviceHandle is what a kernel (through Kernel, as struct ucpx_partition_handle) or a
// host goroutine (PreadyHandle, ParrivedHandle) uses to make the partitions of the
// current iteration ready (sender) or to see them arrive (receiver). Addresses are
// device addresses on CUDA backends and host addresses on host backends.
type DeviceHandle struct {
	// Words are the sender's ready flags (one per own partition) or the receiver's
	// arrival counters (one per sender partition).
	Words uintptr
	// Triggers (sender) is the address of a table holding the address of each
	// partition's trigger word; 0 on a receiver's handle.
	Triggers uintptr
	// TriggerValue (sender) is what making a partition ready stores into its trigger
	// word in this iteration.
	TriggerValue uint64
	// Iteration is the iteration the handle belongs to (the request's count of Starts).
	Iteration uint64
	// Failed is the value every word holds once the peer failed.
	Failed uint64
	// Partitions, PartBytes: this side's partition count and size; PeerPartBytes: the
	// peer's partition size (the two sides' counts may differ).
	Partitions, PartBytes, PeerPartBytes int
	// Buf, PeerBuf, PeerWords (a sender on the direct path, else 0): this side's
	// buffer, and the receiver's buffer and arrival counters mapped in this process.
	// With them ucpx_pready moves the partition itself (copy, then the iteration
	// into the counter) and Triggers is 0.
	Buf, PeerBuf, PeerWords uintptr

	r *Request
}

// Kernel is the handle as the kernel argument struct ucpx_partition_handle (88 bytes).
func (h DeviceHandle) Kernel() device.PartitionHandle {
	return device.PartitionHandle{
		Words: uint64(h.Words), Triggers: uint64(h.Triggers), TriggerValue: h.TriggerValue,
		Iteration: h.Iteration, Failed: h.Failed, Partitions: uint64(h.Partitions),
		PartBytes: uint64(h.PartBytes), PeerPartBytes: uint64(h.PeerPartBytes),
		Buf: uint64(h.Buf), PeerBuf: uint64(h.PeerBuf), PeerWords: uint64(h.PeerWords),
	}
}

// DeviceHandle returns the handle of the current iteration, for kernels (Kernel) or
// host goroutines (PreadyHandle, ParrivedHandle). Fetch it after every Start, before
// launching the kernel that uses it: it names the iteration, and a handle of an
// earlier iteration does nothing useful (on the device ucpx_pready then hands over
// nothing and the iteration never completes; the host twins report it).
//
// On a sender the first call makes one KernelTriggered condition per partition (on
// CUDA backends each holds its own page of pinned memory) and a table of their
// trigger words; each iteration's first call arms every partition's put-with-signal
// on its condition, to be issued once the partition was made ready (ucpx_pready or
// PreadyHandle), so the partitions of that iteration can no longer be made ready from
// the host (Pready), and DeviceHandle is refused in an iteration where some already
// were. Wait and Test cover the armed puts as they cover Pready's: the iteration is
// complete once every partition was moved. The receiver's handle needs nothing armed.
//
// The receiver's readiness reaches the sender's flags through UCX, which may need the
// sender's worker to progress (tcp, and RMA emulated over active messages): the host
// thread that launched the kernel calls Wait (or Test), which does, or the worker has
// ucp.WorkerParams.ProgressThread. Likewise the receiver's Wait progresses the arrival
// of the data. The partitioned buffer is host-mapped pinned memory or device memory
// (Params.MemoryType): for a device buffer, ucpx_pready hands the partition to one of
// the request's streams, which copies it to the host copy and triggers its put, and
// the receiver's handle names landed words that the request's streams store only
// once a partition was copied into the device buffer.
//
// A dead peer stores DeviceHandle.Failed into the request's words: a kernel waiting
// in ucpx_pready or ucpx_parrived_wait returns false, ucpx_pstatus reports
// UCPX_PART_FAILED, the twins return an error matching ucp.ErrPeerFailed, and the
// armed puts end canceled (Wait reports the peer's error).
func (r *Request) DeviceHandle() (DeviceHandle, error) {
	if r == nil {
		return DeviceHandle{}, fmt.Errorf("device handle: nil request: %w", ErrInvalidParam)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.errLocked(); err != nil {
		return DeviceHandle{}, fmt.Errorf("device handle: %w", err)
	}
	if r.iter == 0 {
		return DeviceHandle{}, fmt.Errorf("device handle before Start: %w", ErrInvalidParam)
	}
	h := DeviceHandle{
		Words: r.wordAddr(r.words, 0), Iteration: r.iter, Failed: failedWord,
		Partitions: r.parts, PartBytes: len(r.buf) / r.parts, PeerPartBytes: len(r.buf) / r.remote.parts,
		r: r,
	}
	if r.role == receiver {
		if r.st != nil {
			// A kernel waits for the landed words: one per own partition.
			h.Words, h.PeerPartBytes = r.wordAddr(r.st.landed, 0), h.PartBytes
		}
		return h, nil
	}
	if err := r.armDeviceLocked(); err != nil {
		return DeviceHandle{}, fmt.Errorf("device handle: %w", err)
	}
	if r.dev.direct {
		var err error
		h.Buf = ptrOf(r.buf)
		if h.PeerBuf, err = r.remote.bufKey.DeviceAddress(r.remote.bufBase, len(r.buf)); err != nil {
			return DeviceHandle{}, fmt.Errorf("device handle: %w", err)
		}
		if h.PeerWords, err = r.remote.wordKey.DeviceAddress(r.remote.wordBase, 8*r.parts); err != nil {
			return DeviceHandle{}, fmt.Errorf("device handle: %w", err)
		}
		return h, nil
	}
	h.Triggers = r.wordAddr(r.dev.table, 0)
	h.TriggerValue = r.dev.value
	return h, nil
}

// wordAddr is the address kernels use for word i of b: its device address on CUDA,
// its host address on host backends.
func (r *Request) wordAddr(b interface{ Word(int) *stream.Word }, i int) uintptr {
	w := b.Word(i)
	if r.backend.Kind() == stream.KindCUDA {
		return w.DevicePtr()
	}
	return w.HostPtr()
}

// armDeviceLocked arms the current iteration's puts on the partitions' conditions,
// once per iteration. Caller holds r.mu.
func (r *Request) armDeviceLocked() error {
	d := r.dev
	if d != nil && d.armed == r.iter {
		return nil
	}
	if !r.active {
		return fmt.Errorf("iteration %d is complete: Start the next one first: %w", r.iter, ErrInvalidParam)
	}
	for p, ready := range r.readied {
		if ready {
			return fmt.Errorf("partition %d was made ready from the host in iteration %d: %w", p, r.iter, ErrInvalidParam)
		}
	}
	if d == nil {
		var err error
		if d, err = r.newDeviceState(); err != nil {
			return err
		}
		r.dev = d
	}
	if r.st != nil {
		return r.armStagedLocked()
	}
	if d.direct {
		// The kernel moves every partition; Test sees them moved in the flags the
		// kernel marks (movedLocked).
		for p := range r.parts {
			r.markReadyLocked(p)
		}
		d.armed = r.iter
		return nil
	}
	for p, cond := range d.conds {
		req, err := r.putLocked(p, &ucp.RequestParam{Condition: cond}, false)
		if err != nil {
			// The puts armed already would wait for triggers no kernel stores: cancel
			// them and trigger, so they end without moving anything. The request can
			// run no more iterations.
			for q := range p {
				d.reqs[q].Cancel()
				if hd, herr := d.conds[q].DeviceHandle(); herr == nil {
					_ = condition.Trigger(hd)
				}
			}
			r.err = fmt.Errorf("prepared %s tag %#x: arm partition %d: %w", r.role, r.tag, p, err)
			r.active = false
			return r.err
		}
		d.reqs[p] = req
		r.markReadyLocked(p)
		r.inflight = append(r.inflight, req)
	}
	for p, cond := range d.conds {
		hd, err := cond.DeviceHandle()
		if err != nil {
			return err
		}
		d.handles[p] = hd
	}
	// Every condition was armed once per device iteration: one trigger value.
	d.value = d.handles[0].Value
	for p, hd := range d.handles {
		if hd.Value != d.value {
			return fmt.Errorf("partition %d's condition is at operation %d, partition 0's at %d", p, hd.Value, d.value)
		}
	}
	d.armed = r.iter
	return nil
}

// armStagedLocked arms a staged sender's iteration: per partition, one of the
// request's streams waits for ucpx_pready's store into kready[p], copies the partition
// to the host copy and triggers its put. Caller holds r.mu.
func (r *Request) armStagedLocked() error {
	d := r.dev
	for p := range r.parts {
		s := r.st.streamFor(p)
		cond, err := r.streamCondLocked(s)
		if err == nil {
			err = s.WaitValue(d.kready.Word(p), r.iter, stream.GEQ)
		}
		if err == nil {
			err = r.copyOut(s, p)
		}
		var req *ucp.Request
		if err == nil {
			req, err = r.putLocked(p, &ucp.RequestParam{Condition: cond, Flags: ucp.NonBlockingEnqueue}, false)
		}
		if err != nil {
			// The streams hold waits no kernel answers: release them (the puts already
			// enqueued then move stale data; the iteration fails). The request can run no
			// more iterations.
			r.err = fmt.Errorf("prepared %s tag %#x: arm partition %d: %w", r.role, r.tag, p, err)
			r.storeFailedLocked()
			return r.err
		}
		d.reqs[p] = req
		r.markReadyLocked(p)
		r.inflight = append(r.inflight, req)
	}
	d.value = r.iter
	d.armed = r.iter
	return nil
}

// newDeviceState makes a sender's conditions and trigger table. Caller holds r.mu.
func (r *Request) newDeviceState() (*deviceState, error) {
	d := &deviceState{
		handles: make([]condition.DeviceHandle, r.parts),
		reqs:    make([]*ucp.Request, r.parts),
		taken:   make([]uint64, r.parts),
	}
	if r.direct && r.remote.bufKey.Device() {
		d.direct = true
		return d, nil
	}
	table, err := r.backend.AllocWords(r.parts)
	if err != nil {
		return nil, fmt.Errorf("trigger table: %w", err)
	}
	d.table = table
	if r.st != nil {
		kready, err := r.backend.AllocWords(r.parts)
		if err != nil {
			_ = d.close()
			return nil, fmt.Errorf("ready words: %w", err)
		}
		d.kready = kready
		for p := range r.parts {
			table.Word(p).Store(uint64(r.wordAddr(kready, p)))
		}
		return d, nil
	}
	d.conds = make([]*condition.Condition, r.parts)
	for p := range d.conds {
		c, err := condition.Create(condition.Param{Category: condition.KernelTriggered, Backend: r.backend})
		if err != nil {
			_ = d.close()
			return nil, fmt.Errorf("partition %d's condition: %w", p, err)
		}
		d.conds[p] = c
		hd, err := c.DeviceHandle()
		if err != nil {
			_ = d.close()
			return nil, err
		}
		table.Word(p).Store(uint64(hd.Trigger))
	}
	return d, nil
}

// failDevice ends the puts a dead peer left armed: each is canceled, then triggered
// from the host, so the engine retires it without moving anything (a kernel stores
// the same trigger value, or none: it sees the failed flag). Called by fail.
func (r *Request) failDevice() {
	r.mu.Lock()
	defer r.mu.Unlock()
	d := r.dev
	if d == nil || r.freed || d.armed != r.iter || d.kready != nil || d.direct {
		return // a staged request's streams were released by fail's failed words
	}
	for p, req := range d.reqs {
		if req != nil && !req.Done() {
			req.Cancel()
			_ = condition.Trigger(d.handles[p])
		}
	}
}

// close destroys the conditions (waiting briefly for puts a failure canceled to
// retire) and frees the table. nil-safe.
func (d *deviceState) close() error {
	if d == nil {
		return nil
	}
	var first error
	for _, c := range d.conds {
		if err := destroyCondition(c); err != nil && first == nil {
			first = err
		}
	}
	if d.table != nil {
		if err := d.table.Close(); err != nil && first == nil {
			first = err
		}
	}
	if d.kready != nil {
		if err := d.kready.Close(); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// destroyCondition destroys c, waiting up to 5 s while a launch runs a graph
// condition's operation (Free destroys stream and kernel-triggered conditions only
// once none of their operations is pending). nil-safe.
func destroyCondition(c *condition.Condition) error {
	if c == nil {
		return nil
	}
	err := c.Destroy()
	for deadline := time.Now().Add(5 * time.Second); errors.Is(err, condition.ErrBusy) && time.Now().Before(deadline); {
		time.Sleep(20 * time.Microsecond)
		err = c.Destroy()
	}
	if errors.Is(err, condition.ErrDestroyed) {
		return nil
	}
	return err
}

// checkLocked validates a twin's handle and partition. Caller holds r.mu.
func (h DeviceHandle) checkLocked(op string, ro role, p int) error {
	r := h.r
	if err := r.errLocked(); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	switch {
	case r.role != ro:
		return fmt.Errorf("%s with a %s request's handle: %w", op, r.role, ErrInvalidParam)
	case p < 0 || p >= r.parts:
		return fmt.Errorf("%s: partition %d of %d: %w", op, p, r.parts, ErrInvalidParam)
	case h.Iteration != r.iter:
		return fmt.Errorf("%s: handle of iteration %d in iteration %d (fetch it after every Start): %w", op, h.Iteration, r.iter, ErrInvalidParam)
	case ro == sender && (r.dev == nil || r.dev.armed != r.iter):
		return fmt.Errorf("%s: iteration %d was not armed by DeviceHandle: %w", op, r.iter, ErrInvalidParam)
	}
	return nil
}

// peerFailedLocked is the error of a word that holds the failed value. Caller holds
// r.mu.
func (r *Request) peerFailedLocked(op string, p int) error {
	if err := r.errLocked(); err != nil {
		return fmt.Errorf("%s: partition %d: %w", op, p, err)
	}
	return fmt.Errorf("%s: partition %d: %w", op, p, ucp.ErrPeerFailed)
}

// PreadyHandle is the host twin of ucpx_pready(h, p): it waits until the receiver is
// ready for the iteration (ready flag p is 1), takes the flag (stores 0) and stores
// h.TriggerValue into partition p's trigger word, upon which the engine moves the
// partition. Writes the caller made to the partition before the call are what moves.
// While it waits it progresses the worker, as a host stream waiting on the flag
// does. A dead peer (the flag holds h.Failed) gives an error matching
// ucp.ErrPeerFailed. It also reports what a kernel cannot: a handle of another
// iteration or request role, p out of range, p made ready twice in one iteration
// (ErrInvalidParam), a freed request (ErrClosed).
func PreadyHandle(h DeviceHandle, p int) error {
	const op = "pready handle"
	r := h.r
	if r == nil {
		return fmt.Errorf("%s: zero handle: %w", op, ErrInvalidParam)
	}
	r.mu.Lock()
	if err := h.checkLocked(op, sender, p); err != nil {
		r.mu.Unlock()
		return err
	}
	d := r.dev
	if d.taken[p] == h.Iteration {
		r.mu.Unlock()
		return fmt.Errorf("%s: partition %d already ready in iteration %d: %w", op, p, h.Iteration, ErrInvalidParam)
	}
	d.taken[p] = h.Iteration
	r.mu.Unlock()
	start := time.Now()
	for i := 0; ; i++ {
		r.mu.Lock()
		// Checked again each time: the words are freed with the request.
		if err := h.checkLocked(op, sender, p); err != nil {
			r.mu.Unlock()
			return err
		}
		flag := r.words.Word(p)
		switch v := flag.Load(); {
		case d.direct && readyValue(v) && flag.CompareAndSwap(v, movedBit|v):
			// What ucpx_pready does on the direct path, through ucp: the flag marked
			// moved (before the receiver can set it again), a copy into the receiver's
			// buffer on the worker's stream, then the counter.
			req, err := r.putLocked(p, nil, false)
			if err == nil {
				r.inflight = append(r.inflight, req)
			} else if r.iterErr == nil {
				r.iterErr = fmt.Errorf("%s: partition %d: %w", op, p, err) // marked moved, but it did not
			}
			r.mu.Unlock()
			return err
		case !d.direct && readyValue(v) && flag.CompareAndSwap(v, 0):
			var err error
			if d.kready != nil {
				d.kready.Word(p).Store(h.TriggerValue)
				d.kready.Notify()
			} else {
				err = condition.Trigger(d.handles[p])
			}
			r.mu.Unlock()
			return err
		case v == failedWord:
			err := r.peerFailedLocked(op, p)
			r.mu.Unlock()
			return err
		}
		r.mu.Unlock()
		// The receiver's write may need this worker's progress (tcp).
		if !flag.Block().Drive() && i >= 64 {
			backoff.Pause(start)
		}
	}
}

// ParrivedHandle is the host twin of ucpx_parrived(h, q) (and ucpx_pstatus): it
// reports whether receive partition q of the handle's iteration has arrived, that is
// every sender partition overlapping it has (its arrival counter reached
// h.Iteration), progressing the worker once if not. A dead peer (the counters hold
// h.Failed) gives an error matching ucp.ErrPeerFailed. It also reports a handle of
// another iteration or request role and q out of range (ErrInvalidParam), and a freed
// request (ErrClosed).
func ParrivedHandle(h DeviceHandle, q int) (bool, error) {
	const op = "parrived handle"
	r := h.r
	if r == nil {
		return false, fmt.Errorf("%s: zero handle: %w", op, ErrInvalidParam)
	}
	ok, err := h.parrived(op, q)
	if ok || err != nil {
		return ok, err
	}
	r.words.Word(0).Block().Drive()
	return h.parrived(op, q)
}

// parrived is one look at the counters covering q, as ucpx_pstatus takes.
func (h DeviceHandle) parrived(op string, q int) (bool, error) {
	r := h.r
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := h.checkLocked(op, receiver, q); err != nil {
		return false, err
	}
	// checkLocked made sure h.Iteration is the request's current iteration.
	ok, failed := r.landed(q)
	if failed {
		return false, r.peerFailedLocked(op, q)
	}
	return ok, nil
}
