package ucp

import (
	"sync"

	"github.com/ucpx/ucpx/protocol"
)

// StagingStats is what a worker's operations moved through staging memory.
type StagingStats = protocol.StagingStats

// StagingStats reports what this worker's operations staged so far: bytes, parts, the
// most staging memory lent at once, and how often an operation waited for the
// workspace (back-pressure). Operations with a condition count once their plan is
// made, operations without one once their staging memory is lent.
func (w *Worker) StagingStats() StagingStats {
	if w == nil {
		return StagingStats{}
	}
	return w.staging.Snapshot()
}

// plainStaging is the staging memory of a worker's operations without a condition
// under StageAlways: the context's workspace when it has one, else a pool of mapped
// host memory made on first use. The CPU copies there (only host buffers stage so).
type plainStaging struct {
	mu   sync.Mutex
	pool *protocol.Pool
}

func (s *plainStaging) get() *protocol.Pool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pool == nil {
		s.pool = protocol.NewPool(nil)
	}
	return s.pool
}

func (s *plainStaging) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pool != nil {
		_ = s.pool.Close()
	}
}

// stagesPlain reports whether an operation without a condition moves through staging.
func (w *Worker) stagesPlain(p *RequestParam) bool {
	return p.staged == nil && (p.Staging.Or(w.ctx.protocol.Staging) == protocol.StageAlways || w.devicePlain(p))
}

// stagedPlain runs issue (the operation without a condition) on staging memory that
// stands for buf: an outgoing buf is copied in first, an incoming one copied out on
// completion, before the Request is done and before its Callback. It waits (driving
// the worker) while the context's workspace is busy.
func (w *Worker) stagedPlain(op string, p *RequestParam, buf []byte, dir protocol.Direction, issue func(b []byte, ip *RequestParam) (*Request, error)) (*Request, error) {
	if w.devicePlain(p) {
		return w.stagedDevice(op, p, buf, dir, issue)
	}
	if len(buf) == 0 {
		ip := *p
		ip.Staging = protocol.StageWhenNeeded
		return issue(buf, &ip)
	}
	if p.MemoryType != MemoryHost || (p.MemH != nil && p.MemH.MemoryType() != MemoryHost) {
		// The CPU copies here: memory that may be device memory (MemoryUnknown
		// included) must not reach it.
		return nil, opErr(op, ErrUnsupported, "StageAlways on %s memory without a condition: only host memory is staged by the CPU; staging device memory needs a Stream condition", p.MemoryType)
	}
	mem, release, err := protocol.LendHost(w.ctx.protocol.Workspace, w.plain.get(), len(buf), dir, &w.staging, func() error {
		if w.closed.Load() {
			return ErrClosed
		}
		w.Progress()
		return nil
	})
	if err != nil {
		return nil, opErr(op, err, "staging memory")
	}
	if dir == protocol.Out {
		copy(mem, buf)
	}
	var once sync.Once
	finish := func(r *Request) {
		once.Do(func() {
			if dir == protocol.In && r != nil && r.err == nil {
				n := len(mem) // a get fills it all
				if r.length > 0 || op == "tag_recv_nbx" {
					n = min(r.length, n)
				}
				copy(buf, mem[:n])
			}
			release()
		})
	}
	ip := *p
	ip.MemoryType, ip.MemH = MemoryHost, nil
	ip.staged = finish
	r, err := issue(mem, &ip)
	if err != nil {
		finish(nil)
		return r, err
	}
	if r.Done() {
		// Completed in place (postLocked installed no hook), or already completed
		// through the hook (once makes this a no-op).
		finish(r)
	}
	return r, nil
}
