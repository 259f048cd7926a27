package protocol

import (
	"fmt"
	"sync"

	"github.com/ucpx/ucpx/stream/streamcore"
)

// Workspace is a user-supplied staging workspace: a fixed amount of staging memory
// that every staged operation of one backend moves through (protocol.Config.Workspace),
// instead of the pool, which grows with demand. It bounds the staging memory an
// application uses, and applies back-pressure: an operation finding the workspace busy
// waits for it instead of failing.
//
// The memory is split in two halves, one for outgoing data (sends, puts) and one for
// incoming (receives, gets), so a receive waiting for its peer never holds the memory
// the sends that peer waits for would need. Each half is a ring of WorkspaceSlots
// slots, used in order; a use of a slot waits until the slot's previous use is done:
//
//   - on a stream, the wait is a stream wait on a signal word (no thread blocks), so a
//     large RMA streams through the workspace in slot-sized parts, part i+n reusing the
//     slot of part i once that one completed;
//   - for an operation with no condition (CPU copies), the calling goroutine waits,
//     running the idle function it was given (ucp progresses the worker).
//
// A wait that could deadlock is never made: a part whose slot is still held by another
// operation on the same stream (which may sit in an open group whose one trigger
// comes after the wait) or by one not enqueued yet, and a CPU lender whose slot is held
// by stream work, take pool memory of their own instead (StagingStats.Oversize). So does
// a message (tag, AM: one UCX message each) larger than one half, which cannot move in
// parts. RMA completes without the peer's participation, so RMA back-pressure cannot
// deadlock; messages waiting across streams can, as any bounded buffering can, when the
// peers' waits form a cycle: size the workspace for the messages in flight at once.
type Workspace struct {
	backend streamcore.Backend // nil: host memory, for operations without a stream only
	mem     streamcore.Pinned
	words   *streamcore.WordBlock // per slot: freed (both halves), then landed (both)
	slot    int

	mu     sync.Mutex
	rings  [2]ring
	busy   int // slots with a use not done
	closed bool
}

// WorkspaceSlots is the number of slots of each half of a Workspace.
const WorkspaceSlots = 4

// MinWorkspace is the smallest workspace: a 4 KiB slot per slot of each half.
const MinWorkspace = 2 * WorkspaceSlots * 4096

type ring struct {
	next  int
	slots [WorkspaceSlots]slotState
}

type slotState struct {
	uses  uint64              // uses assigned so far
	freed uint64              // every use up to this one is done
	early map[uint64]struct{} // uses done out of order (given back unused)
	live  []*lease            // leases not given back, oldest first
}

// NewWorkspace allocates a workspace of bytes for the staged operations of backend b
// (page-locked host memory on CUDA backends, through streamcore.HostStaging; mapped
// host memory on host backends). b may be nil: the workspace then serves operations
// without a condition only. Slots are bytes/(2*WorkspaceSlots), rounded down to 4 KiB;
// bytes below MinWorkspace fail with ErrInvalidParam.
func NewWorkspace(b streamcore.Backend, bytes int) (*Workspace, error) {
	if bytes < MinWorkspace {
		return nil, fmt.Errorf("workspace of %d bytes: at least %d: %w", bytes, MinWorkspace, ErrInvalidParam)
	}
	slot := bytes / (2 * WorkspaceSlots) &^ 4095
	ws := &Workspace{backend: b, slot: slot}
	size := 2 * WorkspaceSlots * slot
	hs, _ := b.(streamcore.HostStaging)
	var err error
	if ws.mem, err = allocStaging(hs, size); err != nil {
		return nil, fmt.Errorf("workspace: %w", err)
	}
	if b != nil {
		if ws.words, err = b.AllocWords(4 * WorkspaceSlots); err != nil {
			_ = ws.mem.Close()
			return nil, fmt.Errorf("workspace words: %w", err)
		}
	}
	return ws, nil
}

// Size is the workspace's size in bytes (both halves).
func (ws *Workspace) Size() int {
	if ws == nil {
		return 0
	}
	return 2 * WorkspaceSlots * ws.slot
}

// SlotSize is the size of one slot: the part size of RMA moved through it.
func (ws *Workspace) SlotSize() int {
	if ws == nil {
		return 0
	}
	return ws.slot
}

// Backend is the backend the workspace serves (nil: operations without a stream).
func (ws *Workspace) Backend() streamcore.Backend {
	if ws == nil {
		return nil
	}
	return ws.backend
}

// Close frees the workspace's memory. Operations still using it must be done: close
// it after the contexts whose Config name it.
func (ws *Workspace) Close() error {
	if ws == nil {
		return fmt.Errorf("workspace close: nil workspace: %w", ErrInvalidParam)
	}
	ws.mu.Lock()
	if ws.closed {
		ws.mu.Unlock()
		return fmt.Errorf("workspace: %w", ErrClosed)
	}
	ws.closed = true
	ws.mu.Unlock()
	err := ws.mem.Close()
	if ws.words != nil {
		if werr := ws.words.Close(); err == nil {
			err = werr
		}
	}
	return err
}

func half(dir Direction) int {
	if dir == In {
		return 1
	}
	return 0
}

// lease is a run of consecutive slots of one half lent to one part.
type lease struct {
	ws    *Workspace
	h     int // half
	first int
	k     int
	n     int      // bytes used
	uses  []uint64 // the use number of each slot
	done  bool     // given back (under ws.mu)
	stats *Stats
	// stream is the stream the lease's part was enqueued on (under ws.mu; nil until
	// then): a later use may wait for this one on a stream only from another stream.
	stream streamcore.Stream
	// cpu: the lease of an operation without a stream (LendHost): it ends once the
	// transport completes the operation, with no stream work in between.
	cpu bool
}

// slots a message of n bytes needs; 0 when it cannot fit a half.
func (ws *Workspace) slotsFor(n int) int {
	k := (n + ws.slot - 1) / ws.slot
	if k > WorkspaceSlots {
		return 0
	}
	return max(k, 1)
}

// take lends k consecutive slots of dir's half for n bytes. Under ws.mu.
func (ws *Workspace) takeLocked(n, k int, dir Direction, st *Stats) (*lease, error) {
	if ws.closed {
		return nil, fmt.Errorf("workspace: %w", ErrClosed)
	}
	h := half(dir)
	r := &ws.rings[h]
	start := r.next
	if start+k > WorkspaceSlots {
		start = 0 // a run never wraps
	}
	l := &lease{ws: ws, h: h, first: start, k: k, n: n, uses: make([]uint64, k), stats: st}
	for i := range k {
		s := &r.slots[start+i]
		if s.uses == s.freed {
			ws.busy++
		}
		s.uses++
		l.uses[i] = s.uses
		s.live = append(s.live, l)
	}
	r.next = (start + k) % WorkspaceSlots
	st.workspace(ws.busy * ws.slot)
	return l, nil
}

// busyLocked reports whether a slot of l still waits for its previous use.
func (l *lease) busyLocked() bool {
	r := &l.ws.rings[l.h]
	for i := range l.k {
		if r.slots[l.first+i].freed < l.uses[i]-1 {
			return true
		}
	}
	return false
}

func (l *lease) addr() uintptr {
	return l.ws.mem.Addr() + uintptr((l.h*WorkspaceSlots+l.first)*l.ws.slot)
}

func (l *lease) bytes() []byte {
	off := (l.h*WorkspaceSlots + l.first) * l.ws.slot
	return l.ws.mem.Bytes()[off : off+l.n]
}

func (ws *Workspace) freedWord(h, i int) *streamcore.Word {
	return ws.words.Word(h*WorkspaceSlots + i)
}

func (ws *Workspace) landedWord(h, i int) *streamcore.Word {
	return ws.words.Word(2*WorkspaceSlots + h*WorkspaceSlots + i)
}

// waitFree enqueues on s the waits for the previous uses of l's slots.
func (l *lease) waitFree(s streamcore.Stream, prev []uint64) error {
	for i, p := range prev {
		if p == 0 {
			continue
		}
		if err := s.WaitValue(l.ws.freedWord(l.h, l.first+i), p, streamcore.GEQ); err != nil {
			return err
		}
	}
	return nil
}

// armOn records that l's part is enqueued on stream s, and reports whether s may wait
// for the earlier uses of l's slots that are not done: only if each is enqueued on
// another stream already. One enqueued on s itself may sit in an open group of s whose
// single trigger comes after this wait (a deadlock), and one not enqueued yet (another
// goroutine's, between its plan and its enqueue) may come after it on s.
func (l *lease) armOn(s streamcore.Stream) bool {
	ws := l.ws
	ws.mu.Lock()
	defer ws.mu.Unlock()
	l.stream = s
	return !l.anyEarlierLocked(func(x *lease) bool { return !x.cpu && (x.stream == nil || x.stream == s) })
}

// onlyCPUBeforeLocked reports whether every earlier live use of l's slots is a CPU
// lease.
func (l *lease) onlyCPUBeforeLocked() bool {
	return !l.anyEarlierLocked(func(x *lease) bool { return !x.cpu })
}

// anyEarlierLocked reports whether f holds for a live use of l's slots earlier than l.
func (l *lease) anyEarlierLocked(f func(x *lease) bool) bool {
	r := &l.ws.rings[l.h]
	for i := range l.k {
		for _, x := range r.slots[l.first+i].live {
			if x == l {
				break // later leases come after l
			}
			if f(x) {
				return true
			}
		}
	}
	return false
}

// pendingPrevLocked is, per slot, the previous use still to wait for (0: none).
func (l *lease) pendingPrevLocked() (prev []uint64, any bool) {
	r := &l.ws.rings[l.h]
	prev = make([]uint64, l.k)
	for i := range l.k {
		if p := l.uses[i] - 1; r.slots[l.first+i].freed < p {
			prev[i], any = p, true
		}
	}
	return prev, any
}

// free gives l back (idempotent): each slot's freed count advances over every use done.
func (l *lease) free() {
	ws := l.ws
	ws.mu.Lock()
	if l.done {
		ws.mu.Unlock()
		return
	}
	l.done = true
	r := &ws.rings[l.h]
	stored := false
	for i := range l.k {
		s := &r.slots[l.first+i]
		for j, x := range s.live {
			if x == l {
				s.live = append(s.live[:j], s.live[j+1:]...)
				break
			}
		}
		u := l.uses[i]
		if u != s.freed+1 {
			if s.early == nil {
				s.early = map[uint64]struct{}{}
			}
			s.early[u] = struct{}{}
			continue
		}
		s.freed = u
		for {
			if _, ok := s.early[s.freed+1]; !ok {
				break
			}
			delete(s.early, s.freed+1)
			s.freed++
		}
		if s.freed == s.uses {
			ws.busy--
		}
		if ws.words != nil && !ws.closed {
			// Under mu: two frees of one slot must not store out of order.
			ws.freedWord(l.h, l.first+i).Store(s.freed)
			stored = true
		}
	}
	l.stats.workspace(ws.busy * ws.slot)
	ws.mu.Unlock()
	if stored {
		ws.words.Notify() // a host stream may be parked on a slot
	}
}

// release is free for callers that may make driver calls (the engine's rounds, the
// user's goroutine; not CUDA host functions): it also rings the device, so a stream
// waiting for the slot notices soon (a memop wait is otherwise looked at again only
// now and then).
func (l *lease) release() {
	l.free()
	if l.ws.words != nil {
		_ = l.ws.words.Ring()
	}
}

// land records that l's data arrived (an incoming part completed), for a later part of
// the same operation that copies it out before reusing the slot.
func (l *lease) land() {
	if l.ws.words == nil {
		return
	}
	l.ws.mu.Lock()
	if !l.ws.closed {
		for i := range l.k {
			// Monotonic: a lease given back early (its part took memory of its own)
			// may land after a later use of its slot did.
			if w := l.ws.landedWord(l.h, l.first+i); w.Load() < l.uses[i] {
				w.Store(l.uses[i])
			}
		}
	}
	l.ws.mu.Unlock()
	l.ws.words.Notify()
	_ = l.ws.words.Ring() // called on the engine's rounds
}

// LendHost lends n bytes of staging memory to an operation that has no stream (the
// caller copies with the CPU, so only host buffers stage this way): from ws when set
// and the message fits one of its halves, waiting while its slots are in use (idle
// runs between checks: progress the transport there; an error from it ends the wait),
// else from pool (mapped host memory on a host pool). release gives the memory back
// (once). st, if not nil, counts it.
func LendHost(ws *Workspace, pool *Pool, n int, dir Direction, st *Stats, idle func() error) (mem []byte, release func(), err error) {
	if n <= 0 {
		return nil, nil, fmt.Errorf("staging %d bytes: %w", n, ErrInvalidParam)
	}
	if ws != nil {
		if k := ws.slotsFor(n); k > 0 {
			mem, release, err := ws.lendHost(n, k, dir, st, idle)
			if mem != nil || err != nil {
				return mem, release, err
			}
			// Busy with stream work: memory of its own below.
		} else {
			st.movedAside()
		}
	}
	b, err := pool.Get(n)
	if err != nil {
		return nil, nil, err
	}
	st.staged(n)
	st.lend(b.Size())
	var once sync.Once
	return b.Bytes()[:n], func() {
		once.Do(func() { st.giveBack(b.Size()); pool.Put(b) })
	}, nil
}

func (ws *Workspace) lendHost(n, k int, dir Direction, st *Stats, idle func() error) ([]byte, func(), error) {
	ws.mu.Lock()
	l, err := ws.takeLocked(n, k, dir, st)
	if err != nil {
		ws.mu.Unlock()
		return nil, nil, err
	}
	l.cpu = true
	busy := l.busyLocked()
	onStreams := busy && !l.onlyCPUBeforeLocked()
	ws.mu.Unlock()
	if busy && !onStreams {
		st.waited()
	}
	if onStreams {
		// An earlier use is stream work, which may wait for this goroutine (an open
		// group it has yet to end): never block on it; use memory of its own.
		l.release()
		st.movedAside()
		return nil, nil, nil
	}
	for busy {
		if err := idle(); err != nil {
			l.free()
			return nil, nil, err
		}
		ws.mu.Lock()
		busy = l.busyLocked()
		closed := ws.closed
		ws.mu.Unlock()
		if closed {
			l.free()
			return nil, nil, fmt.Errorf("workspace: %w", ErrClosed)
		}
	}
	st.staged(n)
	return l.bytes(), l.free, nil
}
