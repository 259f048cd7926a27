package stream

import (
	"fmt"
	"sync"
	"sync/atomic"
	"unsafe"
)

// Word is a 64-bit signal word shared between the CPU (proxy thread, host streams) and,
// on CUDA, the GPU. Its memory is never Go memory: C memory on host backends,
// host-mapped pinned memory on CUDA, so C, the GPU and Go may all hold its address.
type Word struct {
	host   *uint64 // CPU address, 8-byte aligned
	device uintptr // GPU address of the same word (0 on host backends)
	block  *WordBlock
}

// Load reads the word with acquire ordering.
func (w *Word) Load() uint64 { return atomic.LoadUint64(w.host) }

// Store writes the word with release ordering.
func (w *Word) Store(v uint64) { atomic.StoreUint64(w.host, v) }

// Add adds delta and returns the new value.
func (w *Word) Add(delta uint64) uint64 { return atomic.AddUint64(w.host, delta) }

// CompareAndSwap is an atomic compare-and-swap on the word.
func (w *Word) CompareAndSwap(old, new uint64) bool {
	return atomic.CompareAndSwapUint64(w.host, old, new)
}

// HostPtr is the CPU address of the word.
func (w *Word) HostPtr() uintptr { return uintptr(unsafe.Pointer(w.host)) }

// DevicePtr is the GPU address of the word, 0 on host backends.
func (w *Word) DevicePtr() uintptr { return w.device }

// Block is the block the word was allocated in.
func (w *Word) Block() *WordBlock { return w.block }

// Kind reports the backend the word belongs to.
func (w *Word) Kind() Kind { return w.block.kind }

func (w *Word) String() string {
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

	doorbell func() error // CUDA: see Ring; nil on host blocks
}

// Changed returns a channel closed at the next Notify. Take it before checking the
// words, then wait on it: a Notify in between is not lost.
func (b *WordBlock) Changed() <-chan struct{} {
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
	b.changeMu.Lock()
	if b.changed != nil {
		close(b.changed)
		b.changed = nil
	}
	b.changeMu.Unlock()
}

// Driver does the work that the words of a block wait for. The proxy engine of package
// ucp attaches one to a condition's words, so a host executor blocked on a completion
// word advances the operation itself instead of waiting for another thread (no thread
// hop, fewer spinning threads than cores), and a trigger stored by a host executor
// wakes the proxy at once instead of at its next poll.
type Driver interface {
	// Drive runs one round of the work; it reports whether anything progressed. It must
	// not block and must not wait on the calling stream.
	Drive() bool
	// Kick tells the driver a word of the block was stored by a host executor.
	Kick()
}

type driverBox struct{ d Driver }

// SetDriver attaches d to the block (nil detaches). GPU-written words are not seen by
// it: a driver that serves CUDA words must also poll.
func (b *WordBlock) SetDriver(d Driver) {
	if d == nil {
		b.driver.Store(nil)
		return
	}
	b.driver.Store(&driverBox{d})
}

// Drive runs the block's driver once (what a host executor does while it waits on one
// of its words); it reports whether anything progressed.
func (b *WordBlock) Drive() bool {
	if box := b.driver.Load(); box != nil {
		return box.d.Drive()
	}
	return false
}

// Kick tells the block's driver that a word was stored (what a host executor's
// WriteValue does); graph tasks that store triggers call it.
func (b *WordBlock) Kick() {
	if box := b.driver.Load(); box != nil {
		box.d.Kick()
	}
}

// NewWordBlock wraps n words at hostBase (and devBase, 0 if none). Backends call it;
// free releases the memory once.
func NewWordBlock(kind Kind, hostBase unsafe.Pointer, devBase uintptr, n int, free func() error) *WordBlock {
	b := &WordBlock{kind: kind, words: make([]Word, n), free: free}
	for i := range b.words {
		b.words[i].host = (*uint64)(unsafe.Add(hostBase, 8*i))
		if devBase != 0 {
			b.words[i].device = devBase + uintptr(8*i)
		}
		b.words[i].block = b
	}
	return b
}

// Ring tells the device that the CPU stored into one of the block's words that a
// stream may be waiting on. A CUDA memop wait (WaitValue, WriteThenWait) that was not
// satisfied when the GPU reached it is looked at again only about every 13 µs when the
// GPU is given nothing else to do; new work submitted to the GPU, on any stream of the
// context, makes it look again within about 5 µs (run 42 of docs/gpu-runs.md). Ring
// submits such work: one memop write on a stream of the backend's own. It costs the
// caller one driver call (1–1.5 µs); on host blocks it does nothing.
func (b *WordBlock) Ring() error {
	if b.doorbell == nil || b.freed.Load() {
		return nil
	}
	return b.doorbell()
}

// Len is the number of words in the block.
func (b *WordBlock) Len() int { return len(b.words) }

// Word returns word i of the block.
func (b *WordBlock) Word(i int) *Word { return &b.words[i] }

// Closed reports whether the block was freed (streams refuse words of a freed block).
func (b *WordBlock) Closed() bool { return b.freed.Load() }

// Close frees the words. Work still enqueued on them must be finished first.
func (b *WordBlock) Close() error {
	if !b.freed.CompareAndSwap(false, true) {
		return fmt.Errorf("word block: %w", ErrClosed)
	}
	return b.free()
}
