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
