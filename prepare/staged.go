package prepare

import (
	"fmt"

	"github.com/ucpx/ucpx/stream"
	"github.com/ucpx/ucpx/ucp"
)

// Staged requests: a device buffer travels through a host copy of itself, one
// partition at a time, because UCX here has no transport for device memory (the
// CUDA-IPC path will replace this within a node). Every copy runs on a stream, so no
// host thread waits for one and the engine never calls the driver:
//
//   - sender: partition p is copied to the host copy on the stream that makes it
//     ready (the caller's for PreadyOnStream; one of the request's own streams for
//     Pready and for kernels), after the receiver's ready flag and before the
//     put-with-signal that the same stream triggers;
//   - receiver: the puts land in the host copy; at Start the request's own streams
//     wait, per receive partition, for its arrival counters, copy it into the device
//     buffer and only then publish it in a landed word. Parrived, ArrivedOnStream,
//     Wait and the kernel handle look at the landed words, so "arrived" means "in
//     the device buffer".
//
// A landed word receives the value of the partition's first arrival counter
// (Stream.CopyWord) instead of a fixed value: if the peer failed, the counter holds
// failedWord and so does the landed word, and a kernel never takes the garbage of a
// partition that did not arrive for data.

// maxStagedPartitions bounds what one Start enqueues on the request's streams (a
// wait per arrival counter and two copies per receive partition): memop waits that
// nobody answers yet must stay few.
const maxStagedPartitions = 1024

// maxStagingStreams: partitions are spread over this many streams of the request,
// so that one partition made ready (or arriving) late holds back only those that
// share its stream.
const maxStagingStreams = 8

// staging is a staged request's host copy and streams.
type staging struct {
	pinned  stream.Pinned // the host copy on backends with HostStaging (CUDA); nil on others
	streams []stream.Stream
	landed  *stream.WordBlock // receiver: one word per own partition
}

// isDevice reports whether t is memory the CPU cannot be assumed to reach.
func isDevice(t ucp.MemoryType) bool {
	return t == ucp.MemoryCUDA || t == ucp.MemoryCUDAManaged
}

// allocStaging makes the host copy (registered: r.memh), the request's streams and,
// on a receiver, the landed words.
func (r *Request) allocStaging() error {
	st := r.st
	n := len(r.buf)
	if hs, ok := r.backend.(stream.HostStaging); ok {
		pin, err := hs.AllocPinned(n)
		if err != nil {
			return fmt.Errorf("staging copy: %w", err)
		}
		st.pinned = pin
		m, err := r.w.Context().MemMap(pin.Bytes()[:n])
		if err != nil {
			return fmt.Errorf("staging copy: %w", err)
		}
		r.memh, r.xfer = m, pin.Bytes()[:n]
	} else {
		m, err := r.w.Context().MemAlloc(n)
		if err != nil {
			return fmt.Errorf("staging copy: %w", err)
		}
		r.memh, r.xfer = m, m.Bytes()[:n]
	}
	r.ownMemh = true
	for range min(r.parts, maxStagingStreams) {
		s, err := r.backend.NewStream()
		if err != nil {
			return fmt.Errorf("staging stream: %w", err)
		}
		st.streams = append(st.streams, s)
	}
	if r.role == receiver {
		landed, err := r.backend.AllocWords(r.parts)
		if err != nil {
			return fmt.Errorf("landed words: %w", err)
		}
		st.landed = landed
	}
	return nil
}

// close releases the streams (each first finishes its work: after a failure every
// wait is released) and the landed words. The host copy is r.memh's, freed by
// release after it. nil-safe.
func (st *staging) close() {
	if st == nil {
		return
	}
	for _, s := range st.streams {
		_ = s.Close()
	}
	if st.landed != nil {
		_ = st.landed.Close()
	}
}

// freePinned frees the host copy's memory once its registration is gone.
func (st *staging) freePinned() {
	if st != nil && st.pinned != nil {
		_ = st.pinned.Close()
	}
}

// streamFor is the request's own stream that carries partition p.
func (st *staging) streamFor(p int) stream.Stream { return st.streams[p%len(st.streams)] }

// copyOut enqueues on s the copy of sender partition p from the buffer to the host
// copy.
func (r *Request) copyOut(s stream.Stream, p int) error {
	off, size := partRange(len(r.buf), r.parts, p)
	return s.Copy(ptrOf(r.xfer)+uintptr(off), ptrOf(r.buf)+uintptr(off), size)
}

// landLocked enqueues the current iteration's landing of every receive partition:
// wait for its arrival counters, copy it into the buffer, publish its landed word.
// Caller holds r.mu.
func (r *Request) landLocked() error {
	st := r.st
	for q := range r.parts {
		s := st.streamFor(q)
		first, last := r.senderParts(q)
		for sp := first; sp <= last; sp++ {
			if err := s.WaitValue(r.words.Word(sp), r.iter, stream.GEQ); err != nil {
				return err
			}
		}
		off, size := partRange(len(r.buf), r.parts, q)
		if err := s.Copy(ptrOf(r.buf)+uintptr(off), ptrOf(r.xfer)+uintptr(off), size); err != nil {
			return err
		}
		if err := s.CopyWord(st.landed.Word(q), r.words.Word(first)); err != nil {
			return err
		}
	}
	return nil
}

// landed reports whether receive partition q of the current iteration is in the
// buffer: for a staged request its landed word, else its arrival counters.
func (r *Request) landed(q int) (ok, failed bool) {
	if r.st == nil {
		first, last := r.senderParts(q)
		ok = true
		for sp := first; sp <= last; sp++ {
			v := r.words.Word(sp).Load()
			if v == failedWord {
				return false, true
			}
			ok = ok && int64(v-r.iter) >= 0
		}
		return ok, false
	}
	switch v := r.st.landed.Word(q).Load(); {
	case v == failedWord:
		return false, true
	default:
		return int64(v-r.iter) >= 0, false
	}
}

// storeFailedLocked stores failedWord into the words streams and kernels may wait on:
// the request's own words, a staged receiver's landed words, a staged sender's ready
// words. Caller holds r.mu.
func (r *Request) storeFailedLocked() {
	var blocks []*stream.WordBlock
	if r.words != nil {
		blocks = append(blocks, r.words.Word(0).Block())
	}
	if r.st != nil && r.st.landed != nil {
		blocks = append(blocks, r.st.landed)
	}
	if r.dev != nil && r.dev.kready != nil {
		blocks = append(blocks, r.dev.kready)
	}
	if r.sentWord != nil {
		blocks = append(blocks, r.sentWord)
	}
	for _, b := range blocks {
		for i := range b.Len() {
			b.Word(i).Store(failedWord)
		}
		b.Notify()
	}
}
