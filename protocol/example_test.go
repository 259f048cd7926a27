package protocol_test

import (
	"fmt"

	"github.com/ucpx/ucpx/protocol"
	"github.com/ucpx/ucpx/stream"
)

// A planner decides how an operation's buffer travels. On host streams every buffer is
// host memory and moves as it is, in one part; on a CUDA backend whose transport has
// no CUDA support, device buffers are staged through pinned host memory (in parts for
// large RMA).
func ExamplePlanner() {
	backend, _ := stream.Open(stream.Host)
	defer backend.Close()
	pl, _ := protocol.NewPlanner(protocol.Config{}, false)
	defer pl.Close()
	var plan protocol.Plan
	err := pl.Plan(protocol.Transfer{Buf: make([]byte, 64<<10), Dir: protocol.Out},
		protocol.Route{Backend: backend, OnStream: true, StreamOrdered: true}, &plan)
	fmt.Println(len(plan.Parts), plan.Staged(), plan.Poll, err)
	// Output: 1 false true <nil>
}

// StageAlways moves even host buffers on host streams through staging memory; a
// Workspace bounds that memory, and an RMA larger than it streams through in parts,
// each part waiting on the stream for its slot. StageNever, on memory with a direct
// path, moves it as is.
func ExampleStaging() {
	backend, _ := stream.Open(stream.Host)
	defer backend.Close()
	ws, _ := protocol.NewWorkspace(backend, protocol.MinWorkspace) // 4 KiB slots
	defer ws.Close()
	var stats protocol.Stats
	pl, _ := protocol.NewPlanner(protocol.Config{Staging: protocol.StageAlways, Workspace: ws, Stats: &stats}, false)
	defer pl.Close()
	route := protocol.Route{Backend: backend, OnStream: true, StreamOrdered: true}
	var plan protocol.Plan
	err := pl.Plan(protocol.Transfer{Buf: make([]byte, 64<<10), Dir: protocol.Out, Splittable: true}, route, &plan)
	fmt.Println(len(plan.Parts), plan.Staged(), err)
	plan.Unused(0) // never run: give the slots back
	err = pl.Plan(protocol.Transfer{Buf: make([]byte, 100), Dir: protocol.Out, Staging: protocol.StageNever}, route, &plan)
	fmt.Println(len(plan.Parts), plan.Staged(), err)
	s := stats.Snapshot()
	fmt.Println(s.Parts, s.Bytes)
	// Output:
	// 16 true <nil>
	// 1 false <nil>
	// 16 65536
}
