package streamcore

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"unsafe"
)

// Word is a 64-bit signal word shared between the CPU (proxy thread, host streams) and,
// on CUDA, the GPU. Its memory is never Go memory: C memory on host backends,
// host-mapped pinned memory on CUDA, so C, the GPU and Go may all hold its address.
//
// Load, Store, Add and CompareAndSwap order memory like sync/atomic, and the race
// detector sees that ordering too (race.go): a goroutine that loads a value another
// goroutine stored is ordered after everything the storer did before the store.
//
// The memory goes back when the block closes (WordBlock.Close; a condition's words with
// Destroy): from then on the word reads 0 and ignores writes. Closing a block while
// another goroutine still uses its words is a race of the caller's, as with any memory
// freed while in use.
type Word struct {
	race   raceSync // first: zero-size without the race detector, no padding
	host   *uint64  // CPU address, 8-byte aligned
	device uintptr  // GPU address of the same word (0 on host backends)
	block  *WordBlock
}

// Load reads the word with acquire ordering. A nil Word (WordBlock.Word of an index
// out of range), or a word of a closed block, reads 0 and ignores Store, Add and
// CompareAndSwap (its memory went back); the stream calls that take such a Word
// refuse it with ErrInvalidArgument or ErrClosed.
func (w *Word) Load() uint64 {
	v, _ := w.TryLoad()
	return v
}

// TryLoad is Load that also reports whether the word was there to read (false: a nil
// Word, or its block closed), for callers that must tell a freed word from a 0.
func (w *Word) TryLoad() (uint64, bool) {
	if w.gone() {
		return 0, false
	}
	v := atomic.LoadUint64(w.host)
	w.raceAcquire()
	return v, true
}

// Store writes the word with release ordering.
func (w *Word) Store(v uint64) { w.TryStore(v) }

// TryStore is Store that reports whether the word was there to write.
func (w *Word) TryStore(v uint64) bool {
	if w.gone() {
		return false
	}
	w.raceRelease()
	atomic.StoreUint64(w.host, v)
	return true
}

// Add adds delta and returns the new value.
func (w *Word) Add(delta uint64) uint64 {
	if w.gone() {
		return 0
	}
	w.raceRelease()
	v := atomic.AddUint64(w.host, delta)
	w.raceAcquire()
	return v
}

// CompareAndSwap is an atomic compare-and-swap on the word.
func (w *Word) CompareAndSwap(old, new uint64) bool {
	if w.gone() {
		return false
	}
	w.raceRelease()
	swapped := atomic.CompareAndSwapUint64(w.host, old, new)
	w.raceAcquire()
	return swapped
}

// gone: no memory behind w (nil, or its block closed). A Close racing with an access
// is the caller's race, as with any memory freed while in use.
func (w *Word) gone() bool {
	return w == nil || w.host == nil || (w.block != nil && w.block.freed.Load())
}

// Valid reports whether w is a word of a block: not nil, nor a zero Word. Streams and
// graphs refuse any other as a nil word (ErrInvalidArgument); the block may be closed.
func (w *Word) Valid() bool { return w != nil && w.host != nil && w.block != nil }

// HostPtr is the CPU address of the word.
func (w *Word) HostPtr() uintptr {
	if w == nil {
		return 0
	}
	return uintptr(unsafe.Pointer(w.host))
}

// DevicePtr is the GPU address of the word, 0 on host backends.
func (w *Word) DevicePtr() uintptr {
	if w == nil {
		return 0
	}
	return w.device
}

// Block is the block the word was allocated in.
func (w *Word) Block() *WordBlock {
	if w == nil {
		return nil
	}
	return w.block
}

// Kind reports the backend the word belongs to.
func (w *Word) Kind() Kind {
	if w == nil || w.block == nil {
		return 0
	}
	return w.block.kind
}

func (w *Word) String() string {
	if w == nil || w.block == nil {
		return "Word(nil)"
	}
	return fmt.Sprintf("Word(%s host=%#x dev=%#x)", w.block.kind, w.HostPtr(), w.device)
}

// WordBlock is a run of signal words allocated together; Close frees them all.
type WordBlock struct {
	kind   Kind
	words  []Word
	free   func() error
	freed  atomic.Bool
	driver atomic.Pointer[driverBox]

	changeMu sync.Mutex
	changed  chan struct{} // closed by Notify; nil until a waiter asks for it

	doorbell func() error // CUDA: see Ring; nil on host blocks. Set by NewWordBlock only.

	// invalid: the block was not made by NewWordBlock with valid arguments (a zero
	// WordBlock has made false; NewWordBlock with n < 0 or a nil hostBase sets
	// invalid): it has no words, and Close reports ErrInvalidArgument.
	made    bool
	invalid string
}

// closedChan is what Changed gives for a nil block.
var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// Changed returns a channel closed at the next Notify. Take it before checking the
// words, then wait on it: a Notify in between is not lost.
func (b *WordBlock) Changed() <-chan struct{} {
	if b == nil {
		return closedChan // nothing to wait for: a waiter looks again at once
	}
	b.changeMu.Lock()
	defer b.changeMu.Unlock()
	if b.changed == nil {
		b.changed = make(chan struct{})
	}
	return b.changed
}

// Notify wakes the goroutines waiting on Changed. Writers that know Go code may be
// parked on the block's words (the proxy firing a host graph's completion word) call it;
// plain stores do not, so GPU-written words still need polling.
func (b *WordBlock) Notify() {
	if b == nil {
		return
	}
	b.changeMu.Lock()
	if b.changed != nil {
		close(b.changed)
		b.changed = nil
	}
	b.changeMu.Unlock()
}

// Driver does the work that the words of a block wait for. The proxy engine of package
// condition attaches one to a condition's words, so a host executor blocked on a completion
// word advances the operation itself instead of waiting for another thread (no thread
// hop, fewer spinning threads than cores), and a trigger stored by a host executor
// wakes the proxy at once instead of at its next poll.
type Driver interface {
	// Drive runs one round of the work; it reports whether anything progressed. It must
	// not block and must not wait on the calling stream.
	Drive() bool
	// Kick tells the driver a word of the block was stored by a host executor. It may
	// do the work on the calling goroutine.
	Kick()
	// Release tells the driver that a goroutine which drove it while waiting on one of
	// the block's words stops driving (it is about to sleep, or its word came): the
	// driver's own goroutine takes over.
	Release()
}

// Follower is a Driver that starts a host graph's communication node itself when the
// node it alone depends on completes (package condition's engine): the successor's
// trigger is stored and its operation issued in the round that completes the first,
// with no trip through the launch (graph.Host uses it).
type Follower interface {
	// Follow arranges that the next completion of the operation whose completion word
	// is done stores 1 into trigger, and starts what trigger starts, before done is
	// stored. It reports false when it cannot; the caller then stores trigger itself.
	Follow(done, trigger *Word) bool
}

// Chainer is a Driver that runs a whole host graph of its communication nodes as one
// completion chain (package condition's engine over ucp: each step of the chain is
// posted from the completion callback of the step before, in C, with no Go between
// the hops). graph.Host uses it when every node of a graph is such a node and the
// dependencies form layers: every node of a layer depends on every node of the
// layers before it, on nothing else.
type Chainer interface {
	// ChainLaunch prepares the operations behind the trigger words, layer after
	// layer, as one run. It returns an error when they cannot run as a chain (an
	// operation of another kind, staged, traced); the caller then launches node by node.
	ChainLaunch(layers [][]*Word) (ChainedLaunch, error)
}

// ChainedLaunch is a host graph's chain (Chainer.ChainLaunch).
type ChainedLaunch interface {
	// Run runs the operations once, layer after layer, and waits until all have
	// completed, as a launch that stores every trigger in turn would: an operation's
	// failure is recorded by its condition (Err) and the layers after it still run;
	// the completion words are not touched (nothing waits on them). ran is false, with
	// nothing done, when the chain no longer describes the nodes (an operation was
	// added to one, a condition was destroyed or failed for good, tracing started) or
	// cannot start (an endpoint closed): the caller launches node by node, and may
	// prepare a new chain. err is set when the run could not finish (the worker closed,
	// or ctx ended: the run is stopped, its pending operations canceled, and the chain
	// can run no more).
	Run(ctx context.Context) (ran bool, err error)
	// Close releases the chain.
	Close() error
}

type driverBox struct{ d Driver }

// SetDriver attaches d to the block (nil detaches). GPU-written words are not seen by
// it: a driver that serves CUDA words must also poll.
func (b *WordBlock) SetDriver(d Driver) {
	if b == nil {
		return
	}
	if d == nil {
		b.driver.Store(nil)
		return
	}
	b.driver.Store(&driverBox{d})
}

// Driver is the block's driver (nil if none).
func (b *WordBlock) Driver() Driver {
	if b == nil {
		return nil
	}
	if box := b.driver.Load(); box != nil {
		return box.d
	}
	return nil
}

// Drive runs the block's driver once (what a host executor does while it waits on one
// of its words); it reports whether anything progressed.
func (b *WordBlock) Drive() bool {
	if d := b.Driver(); d != nil {
		return d.Drive()
	}
	return false
}

// Kick tells the block's driver that a word was stored (what a host executor's
// WriteValue does); graph tasks that store triggers call it.
func (b *WordBlock) Kick() {
	if d := b.Driver(); d != nil {
		d.Kick()
	}
}

// Release tells the block's driver that the calling goroutine, which drove it while
// waiting on a word, stops driving (to sleep, or because the word came).
func (b *WordBlock) Release() {
	if d := b.Driver(); d != nil {
		d.Release()
	}
}

// NewWordBlock wraps n words at hostBase (and devBase, 0 if none). Backends call it;
// free releases the memory once (Close; nil: nothing to free). doorbell is what Ring
// calls while the block is open (the CUDA backend's doorbell write; nil: Ring does
// nothing). Both are fixed here: nothing exported can change what a block frees or
// rings later.
//
// Bad arguments (n < 0, or a nil hostBase with n > 0) do not panic: the block
// returned is already closed and has no words (streams refuse them), and its Close
// returns an error wrapping ErrInvalidArgument; free is not called.
func NewWordBlock(kind Kind, hostBase unsafe.Pointer, devBase uintptr, n int, free, doorbell func() error) *WordBlock {
	switch {
	case n < 0:
		return newInvalidWordBlock(kind, fmt.Sprintf("%d words", n))
	case hostBase == nil && n > 0:
		return newInvalidWordBlock(kind, "nil host address")
	}
	b := &WordBlock{kind: kind, words: make([]Word, n), free: free, doorbell: doorbell, made: true}
	for i := range b.words {
		b.words[i].host = (*uint64)(unsafe.Add(hostBase, 8*i))
		if devBase != 0 {
			b.words[i].device = devBase + uintptr(8*i)
		}
		b.words[i].block = b
	}
	return b
}

func newInvalidWordBlock(kind Kind, why string) *WordBlock {
	b := &WordBlock{kind: kind, made: true, invalid: why}
	b.freed.Store(true)
	return b
}

// Ring tells the device that the CPU stored into one of the block's words that a
// stream may be waiting on. The GPU looks again at a memop wait (WaitValue,
// WriteThenWait) that was not satisfied when it reached it only now and then, unless
// it is handed new work on some stream of the context (docs/performance.md, "Stream
// signal kernels against memop waits"); Ring hands it such work: one memop write on
// the backend's own doorbell stream, which is all a ring costs (no allocation, no
// other driver call: see "Calls the engine makes" in stream/cuda.go). It is never
// needed for correctness; on host blocks it does nothing.
func (b *WordBlock) Ring() error {
	if b == nil || b.doorbell == nil || b.freed.Load() {
		return nil
	}
	return b.doorbell()
}

// Len is the number of words in the block.
func (b *WordBlock) Len() int {
	if b == nil {
		return 0
	}
	return len(b.words)
}

// Word returns word i of the block, nil if i is out of range [0, Len()).
func (b *WordBlock) Word(i int) *Word {
	if b == nil || i < 0 || i >= len(b.words) {
		return nil
	}
	return &b.words[i]
}

// Has reports whether w and the n-1 words after it are words of b.
func (b *WordBlock) Has(w *Word, n int) bool {
	if b == nil || w == nil || n < 1 || len(b.words) == 0 {
		return false
	}
	off := uintptr(unsafe.Pointer(w)) - uintptr(unsafe.Pointer(&b.words[0]))
	size := unsafe.Sizeof(b.words[0])
	if off%size != 0 {
		return false
	}
	i := off / size
	return i < uintptr(len(b.words)) && i+uintptr(n) <= uintptr(len(b.words))
}

// Closed reports whether the block was freed (streams refuse words of a freed block).
func (b *WordBlock) Closed() bool { return b == nil || b.freed.Load() }

// Close frees the words. Work still enqueued on them must be finished first. A
// second Close returns ErrClosed; Close of a nil or zero WordBlock, or of one
// NewWordBlock refused, returns an error wrapping ErrInvalidArgument.
func (b *WordBlock) Close() error {
	switch {
	case b == nil:
		return fmt.Errorf("word block: nil block: %w", ErrInvalidArgument)
	case !b.made:
		return fmt.Errorf("word block: zero WordBlock (not made by a backend or NewWordBlock): %w", ErrInvalidArgument)
	case b.invalid != "":
		return fmt.Errorf("word block: made with %s: %w", b.invalid, ErrInvalidArgument)
	}
	if !b.freed.CompareAndSwap(false, true) {
		return fmt.Errorf("word block: %w", ErrClosed)
	}
	if b.free == nil {
		return nil // nothing to free
	}
	return b.free()
}
