package protocol

import (
	"fmt"
	"sync/atomic"
)

// Staging is the workspace policy: when an operation's buffer moves through the
// staging workspace (pinned host memory on CUDA backends) instead of a direct path. It
// is set per context (Config.Staging, through ucp.ContextParams.Protocol) and per
// operation (Transfer.Staging, through ucp.RequestParam.Staging); an operation's
// StageDefault takes its context's policy.
type Staging uint8

const (
	// StageDefault: per operation, the context's policy; per context, StageWhenNeeded.
	StageDefault Staging = iota
	// StageWhenNeeded stages only what has no direct path: device memory when the
	// transport has no CUDA support (and no IPC path to the peer).
	StageWhenNeeded
	// StageAlways stages every buffer an operation moves on a stream, even where a
	// direct path exists (cuDecomp's choice: predictable memory use and copies that
	// overlap with the transfer). On host streams, host buffers are copied through the
	// workspace too, which is how CI exercises staging without a GPU. Operations with
	// no condition stage host buffers by CPU copies. A host buffer with no stream to
	// copy on (KernelTriggered and Graph conditions, non-blocking receives) moves as
	// is; a device buffer there fails as under StageWhenNeeded.
	StageAlways
	// StageNever never stages: an operation on a device buffer with no direct path
	// fails at the call with an error matching ErrUnsupported (the input is valid, the
	// machinery to move it without staging is missing), instead of staging.
	StageNever
	// PreferPull stages as StageWhenNeeded, and a message whose device buffer the
	// direct (CUDA-IPC) path can carry moves by the receiver pulling from the sender's
	// exported buffer. Tag and active messages already move so under StageWhenNeeded.
	PreferPull
)

func (s Staging) String() string {
	switch s {
	case StageDefault:
		return "StageDefault"
	case StageWhenNeeded:
		return "StageWhenNeeded"
	case StageAlways:
		return "StageAlways"
	case StageNever:
		return "StageNever"
	case PreferPull:
		return "PreferPull"
	}
	return fmt.Sprintf("Staging(%d)", int(s))
}

func (s Staging) valid() bool { return s <= PreferPull }

// Or is s, or ctx where s is StageDefault, or StageWhenNeeded where both are.
func (s Staging) Or(ctx Staging) Staging {
	if s == StageDefault {
		s = ctx
	}
	if s == StageDefault {
		s = StageWhenNeeded
	}
	return s
}

// StagingStats counts what went through staging (ucp.Worker.StagingStats).
type StagingStats struct {
	// Bytes staged (the user's bytes copied through staging memory).
	Bytes uint64
	// Parts: staged pieces (one per staged message, one per staged RMA part).
	Parts uint64
	// HighWater: the most staging memory in use at once, in bytes: the pool's
	// buffers lent (size classes) plus the workspace's busy slots (of the whole
	// workspace, when workers share one).
	HighWater uint64
	// Waits: parts that waited for workspace slots still in use (on the stream, or on
	// the CPU for operations without a condition): back-pressure.
	Waits uint64
	// Oversize: parts that got staging memory of their own instead of workspace
	// slots: messages larger than a half (they cannot move in parts), and parts whose
	// wait for busy slots could have deadlocked (see Workspace).
	Oversize uint64
}

// Stats collects StagingStats; safe for concurrent use. A nil *Stats counts nothing.
type Stats struct {
	bytes, parts, waits, oversize atomic.Uint64
	// inUse: pool memory lent; wsBusy: the workspace's busy slots as last seen (bytes).
	inUse, wsBusy, high atomic.Int64
}

// Snapshot reads the counters.
func (s *Stats) Snapshot() StagingStats {
	if s == nil {
		return StagingStats{}
	}
	return StagingStats{
		Bytes:     s.bytes.Load(),
		Parts:     s.parts.Load(),
		HighWater: uint64(s.high.Load()),
		Waits:     s.waits.Load(),
		Oversize:  s.oversize.Load(),
	}
}

// staged counts one staged part of n bytes.
func (s *Stats) staged(n int) {
	if s != nil {
		s.parts.Add(1)
		s.bytes.Add(uint64(n))
	}
}

func (s *Stats) waited() {
	if s != nil {
		s.waits.Add(1)
	}
}

// movedAside counts a part that took pool memory of its own instead of the workspace.
func (s *Stats) movedAside() {
	if s != nil {
		s.oversize.Add(1)
	}
}

// lend counts n bytes of pool memory lent, raising the high-water mark.
func (s *Stats) lend(n int) {
	if s != nil {
		s.raise(s.inUse.Add(int64(n)) + s.wsBusy.Load())
	}
}

func (s *Stats) giveBack(n int) {
	if s != nil {
		s.inUse.Add(-int64(n))
	}
}

// workspace records the workspace's busy bytes, raising the high-water mark.
func (s *Stats) workspace(busy int) {
	if s != nil {
		s.wsBusy.Store(int64(busy))
		s.raise(int64(busy) + s.inUse.Load())
	}
}

func (s *Stats) raise(v int64) {
	for {
		h := s.high.Load()
		if v <= h || s.high.CompareAndSwap(h, v) {
			return
		}
	}
}
