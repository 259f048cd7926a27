package ucp

import (
	"sync"

	"github.com/ucpx/ucpx/cgo/cuda"
	"github.com/ucpx/ucpx/condition"
	"github.com/ucpx/ucpx/protocol"
)

// StagingPart is the size of the parts a staged RMA operation on a device buffer
// larger than it moves in: part i's transfer overlaps part i+1's staging copy (puts)
// or part i's copy into the device buffer overlaps later parts' transfers (gets).
// Tag and active messages are one UCX message each and are staged whole: moving them
// in parts would need a protocol the receiver knows.
const StagingPart = 4 << 20

// partedOp is the user's view of an operation moved in parts: its Request completes
// when the last part retires, with the first error any part met.
type partedOp struct {
	user *Request
	ops  []*condOp // every part, armed or not

	mu   sync.Mutex
	left int // parts not yet retired (or abandoned)
	err  error
}

// finish counts k parts as ended (err from one of them, nil if none failed). It reports
// whether they were the last, and the operation's error: the first any part met.
func (w *partedOp) finish(k int, err error) (last bool, first error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err == nil {
		w.err = err
	}
	w.left -= k
	return w.left == 0, w.err
}

// enqueueParts stages a device buffer of n bytes at addr in parts of StagingPart bytes,
// each a proxy operation with its own sequence number (Condition.ArmChunks): a put's
// parts are copied out and triggered one by one, so the proxy puts part i while the
// stream copies part i+1; a get's parts all start at once and the stream copies each
// in as soon as it has arrived. The stream-ordered completion is the last part's.
func (w *Worker) enqueueParts(op string, p *RequestParam, cond *condition.Condition, px *proxy, stager *protocol.Stager, addr uintptr, n int, dir direction, streamOrdered bool, issueAt func(off int, buf []byte, p *RequestParam) (*Request, error)) (*Request, error) {
	count := (n + StagingPart - 1) / StagingPart
	user := &Request{w: w, op: op, cb: p.Callback, cond: cond}
	whole := &partedOp{user: user, ops: make([]*condOp, count), left: count}
	work := make([]condition.StreamWork, count)
	stages := make([]*cuda.HostMemory, 0, count)
	for i := range count {
		off := i * StagingPart
		size := min(StagingPart, n-off)
		o := newCondOp(p, issueAt)
		o.user, o.whole, o.off = user, whole, off
		stage, err := o.stage(stager, &work[i], addr+uintptr(off), size, dir)
		if err != nil {
			for _, s := range stages {
				stager.Put(s)
			}
			return nil, opErr(op, err, "staging part %d of %d bytes", i, size)
		}
		stages = append(stages, stage)
		whole.ops[i] = o
	}
	user.condOp = whole.ops[0]

	var addErr error
	added := 0
	armed, err := cond.ArmChunks(streamOrdered, work, func(i int, seq uint64) {
		o := whole.ops[i]
		o.seq, user.seq = seq, seq
		if addErr == nil {
			if addErr = px.add(o); addErr == nil {
				added++
			}
		}
	})
	if armed > 0 && addErr == nil {
		cond.AttachDriver(px)
	}
	// Parts never armed give their staging back and count as ended now.
	for i := armed; i < count; i++ {
		stager.Put(stages[i])
	}
	if addErr != nil {
		// Armed but the proxy is gone (worker closing): fail the parts so the stream
		// moves on (those added before it are failed by the proxy's shutdown).
		for _, o := range whole.ops[added:armed] {
			px.retire(cond, o, opErr(op, ErrClosed, "worker closed"))
		}
		if armed < count {
			if last, first := whole.finish(count-armed, opErr(op, ErrClosed, "worker closed")); last {
				user.finishProxied(first, nil)
			}
		}
		return user, nil
	}
	if armed < count {
		if last, first := whole.finish(count-armed, opErr(op, err, "condition")); last {
			user.finishProxied(first, nil) // no armed part is left to end it
		}
	}
	if err != nil {
		if armed == 0 {
			return nil, opErr(op, err, "condition")
		}
		return user, opErr(op, err, "condition: the operation runs in %d of %d parts", armed, count)
	}
	return user, nil
}
