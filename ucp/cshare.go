package ucp

import (
	"context"
	"runtime"
	"runtime/cgo"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/ucpx/ucpx/cgo/ucx"
	"github.com/ucpx/ucpx/internal/cabi"
)

// workerLock serialises a worker's UCX calls. Goroutines take mu. A worker shared with
// C callers (the C ABI's blocking calls, cgo/ucx/fast.h, which never enter Go when they
// complete inside the call) also has an owner word in C memory: whoever calls UCX holds
// it, so a goroutine holding mu holds owner too.
//
// A C caller holding owner may enter Go to hand over what it could not finish, and
// that takes mu (lockFromC): a goroutine therefore never waits for owner while holding
// mu (lockSlow lets mu go while it waits).
type workerLock struct {
	mu    sync.Mutex
	owner *uint32 // nil unless shared with C; set under mu, never unset
	// yield is the worker's yield word (raw's): nonzero while someone waits for the
	// worker (the engine to issue, an nbx call, a C caller); the C calls that spin
	// return within a progress call then. Updated atomically.
	yield *uint32
}

func (l *workerLock) Lock() {
	l.mu.Lock()
	if l.owner != nil {
		l.takeOwner()
	}
}

// takeOwner takes the owner word once mu is held.
func (l *workerLock) takeOwner() {
	if !atomic.CompareAndSwapUint32(l.owner, 0, 1) {
		l.lockSlow()
	}
}

// lockSlow waits for a C caller to let the worker go; it holds mu on entry and exit.
func (l *workerLock) lockSlow() {
	atomic.AddUint32(l.yield, 1) // a C caller spinning in a fused call stops
	for {
		l.mu.Unlock()
		for i := 0; atomic.LoadUint32(l.owner) != 0; i++ {
			if i >= 64 {
				runtime.Gosched()
			}
		}
		l.mu.Lock()
		if atomic.CompareAndSwapUint32(l.owner, 0, 1) {
			break
		}
	}
	atomic.AddUint32(l.yield, ^uint32(0))
}

func (l *workerLock) TryLock() bool {
	if !l.mu.TryLock() {
		return false
	}
	if l.owner != nil && !atomic.CompareAndSwapUint32(l.owner, 0, 1) {
		l.mu.Unlock()
		return false
	}
	return true
}

func (l *workerLock) Unlock() {
	if l.owner != nil {
		l.releaseOwner()
	}
	l.mu.Unlock()
}

func (l *workerLock) releaseOwner() { atomic.StoreUint32(l.owner, 0) }

// lockFromC takes the lock for a C caller that holds owner already.
func (l *workerLock) lockFromC() { l.mu.Lock() }

func init() {
	cabi.ShareWorker = func(o any) (unsafe.Pointer, error) { return o.(*Worker).shareWithC() }
	cabi.ShareEndpoint = func(o any) (unsafe.Pointer, error) { return o.(*Endpoint).shareWithC() }
	cabi.ResumeTagSend = resumeTagSend
	cabi.ResumeTagRecv = resumeTagRecv
	cabi.ResumeTagSendRecv = resumeTagSendRecv
	cabi.Progress = func(o any) (int, error) {
		w := o.(*Worker)
		n := w.Progress()
		if w.closed.Load() {
			return n, opErr("worker_progress", ErrClosed, "")
		}
		return n, nil
	}
}

// shareWithC gives the worker an owner word and a record C callers reach it by.
func (w *Worker) shareWithC() (unsafe.Pointer, error) {
	const op = "worker_share"
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed.Load() {
		return nil, opErr(op, ErrClosed, "")
	}
	if w.fast == nil {
		if w.mu.owner == nil {
			w.mu.owner = w.raw.Share() // Unlock lets it go from here on
		}
		obj := cgo.NewHandle(w)
		if w.fast = w.raw.NewFast(nil, uintptr(obj), fusedSpins); w.fast == nil {
			obj.Delete()
			return nil, opErr(op, ErrNoMemory, "")
		}
	}
	return w.fast.Ptr(), nil
}

// shareWithC returns the endpoint's record for C callers; its worker must be shared.
func (ep *Endpoint) shareWithC() (unsafe.Pointer, error) {
	const op = "ep_share"
	w := ep.w
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := ep.usableLocked(op); err != nil {
		return nil, err
	}
	if w.mu.owner == nil {
		return nil, opErr(op, ErrInvalidParam, "%s: its worker is not shared with C", ep)
	}
	if ep.fast == nil {
		obj := cgo.NewHandle(ep)
		if ep.fast = w.raw.NewFast(ep.raw, uintptr(obj), fusedSpins); ep.fast == nil {
			obj.Delete()
			return nil, opErr(op, ErrNoMemory, "")
		}
	}
	return ep.fast.Ptr(), nil
}

// retireFast makes a record unusable for C callers (caller holds w.mu, and so the
// owner word) and lets its Go object go.
func retireFast(f **ucx.Fast) {
	if *f == nil {
		return
	}
	(*f).Retire()
	cgo.Handle((*f).Object()).Delete()
	*f = nil
}

// fastObject is the Go object of the record a C caller passed back; the caller holds
// the owner word and found the record usable, so the object is alive.
func fastObject(rec unsafe.Pointer) any { return cgo.Handle(ucx.FastAt(rec).Object()).Value() }

func resumeTagSend(ctx context.Context, rec, ret unsafe.Pointer, buf []byte, tag uint64) error {
	ep := fastObject(rec).(*Endpoint)
	ep.w.mu.lockFromC()
	return ep.tagSendAfterLocked(ctx, ret, buf, tag)
}

func resumeTagRecv(ctx context.Context, rec, ret unsafe.Pointer, buf []byte, tag, mask uint64) (int, uint64, error) {
	w := fastObject(rec).(*Worker)
	w.mu.lockFromC()
	return w.tagRecvAfterLocked(ctx, ret, buf, tag, mask)
}

func resumeTagSendRecv(ctx context.Context, rec, ret unsafe.Pointer, sbuf []byte, stag uint64, rbuf []byte, rtag, rmask uint64) (int, uint64, error) {
	ep := fastObject(rec).(*Endpoint)
	ep.w.mu.lockFromC()
	return ep.tagSendRecvAfterLocked(ctx, ret, sbuf, stag, rbuf, rtag, rmask)
}
