package cuda

/*
#include "shim.h"
*/
import "C"

import "unsafe"

// CaptureMode is a CUstreamCaptureMode: which potentially unsafe API calls
// (synchronous allocations and the like) other threads may make during capture.
type CaptureMode uint32

const (
	// CaptureGlobal forbids unsafe calls from every thread. Note that with
	// goroutines "thread" means OS thread, which Go code does not control;
	// ucpx itself makes no unsafe calls while enqueueing.
	CaptureGlobal CaptureMode = 0
	// CaptureThreadLocal forbids them on the capturing OS thread only.
	CaptureThreadLocal CaptureMode = 1
	// CaptureRelaxed forbids nothing; the usual choice for Go programs.
	CaptureRelaxed CaptureMode = 2
)

// CaptureStatus is a CUstreamCaptureStatus.
type CaptureStatus uint32

const (
	CaptureNone        CaptureStatus = 0
	CaptureActive      CaptureStatus = 1
	CaptureInvalidated CaptureStatus = 2
)

func (c CaptureStatus) String() string {
	switch c {
	case CaptureNone:
		return "none"
	case CaptureActive:
		return "active"
	case CaptureInvalidated:
		return "invalidated"
	}
	return "CaptureStatus(?)"
}

// BeginCapture starts recording the work enqueued on s into a graph instead of
// running it. Memops, copies, kernels, events and host functions are all
// captured; EndCapture returns the graph.
func (s *Stream) BeginCapture(mode CaptureMode) error {
	const op = "cuStreamBeginCapture"
	if mode > CaptureRelaxed {
		return invalid(op, "unknown capture mode %d", mode)
	}
	if err := s.rlock(op); err != nil {
		return err
	}
	defer s.mu.RUnlock()
	return check(op, C.ucpx_stream_begin_capture(s.ctx.h, s.h, C.CUstreamCaptureMode(mode)))
}

// EndCapture ends the capture and returns the recorded graph, which the caller
// owns. Host functions launched during the capture now belong to it.
func (s *Stream) EndCapture() (*Graph, error) {
	const op = "cuStreamEndCapture"
	if err := s.rlock(op); err != nil {
		return nil, err
	}
	defer s.mu.RUnlock()
	var g C.CUgraph
	r := C.ucpx_stream_end_capture(s.ctx.h, s.h, &g)
	fns := s.takeCaptureSet()
	if err := check(op, r); err != nil {
		// The capture is over either way; with no graph to own them, its
		// callbacks can go.
		fns.release()
		return nil, err
	}
	return &Graph{ctx: s.ctx, owned: true, fns: fns, h: g}, nil
}

// CaptureStatus reports whether s is capturing (cuStreamIsCapturing).
func (s *Stream) CaptureStatus() (CaptureStatus, error) {
	const op = "cuStreamIsCapturing"
	if err := s.rlock(op); err != nil {
		return 0, err
	}
	defer s.mu.RUnlock()
	var st C.CUstreamCaptureStatus
	if err := check(op, C.ucpx_stream_is_capturing(s.ctx.h, s.h, &st)); err != nil {
		return 0, err
	}
	return CaptureStatus(st), nil
}

// CaptureInfo describes a capture in progress.
type CaptureInfo struct {
	Status CaptureStatus
	ID     uint64 // unique per capture sequence in the process
	// Graph is the graph being captured, borrowed: nodes may be added to it,
	// and Close only releases the wrapper. Nil unless Status is CaptureActive.
	Graph *Graph
	// Dependencies are the nodes the next captured work will depend on. To
	// splice a node in, add it to Graph with these as dependencies, then
	// UpdateCaptureDependencies([]Node{node}, true).
	Dependencies []Node
}

// CaptureInfo returns the capture state of s (cuStreamGetCaptureInfo).
func (s *Stream) CaptureInfo() (CaptureInfo, error) {
	const op = "cuStreamGetCaptureInfo"
	if err := s.rlock(op); err != nil {
		return CaptureInfo{}, err
	}
	defer s.mu.RUnlock()
	var (
		st    C.CUstreamCaptureStatus
		id    C.uint64_t
		g     C.CUgraph
		ndeps C.size_t
		deps  = make([]Node, 16)
	)
	for {
		r := C.ucpx_stream_get_capture_info(s.ctx.h, s.h, &st, &id, &g,
			(*C.CUgraphNode)(unsafe.Pointer(&deps[0])), C.size_t(len(deps)), &ndeps)
		if err := check(op, r); err != nil {
			return CaptureInfo{}, err
		}
		if int(ndeps) <= len(deps) {
			break
		}
		deps = make([]Node, ndeps)
	}
	info := CaptureInfo{Status: CaptureStatus(st), ID: uint64(id)}
	if info.Status != CaptureActive {
		return info, nil
	}
	info.Dependencies = deps[:ndeps:ndeps]
	if g != nil {
		info.Graph = &Graph{ctx: s.ctx, fns: s.captureSet().retain(), h: g}
	}
	return info, nil
}

// UpdateCaptureDependencies changes the nodes the next captured work depends on:
// replace the set with nodes when set is true, else add nodes to it
// (cuStreamUpdateCaptureDependencies).
func (s *Stream) UpdateCaptureDependencies(nodes []Node, set bool) error {
	const op = "cuStreamUpdateCaptureDependencies"
	if err := checkDeps(op, nodes); err != nil {
		return err
	}
	if err := s.rlock(op); err != nil {
		return err
	}
	defer s.mu.RUnlock()
	flags := C.uint(0) // CU_STREAM_ADD_CAPTURE_DEPENDENCIES
	if set {
		flags = 1 // CU_STREAM_SET_CAPTURE_DEPENDENCIES
	}
	d, n := depsPtr(nodes)
	return check(op, C.ucpx_stream_update_capture_dependencies(s.ctx.h, s.h, d, n, flags))
}
