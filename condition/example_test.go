package condition_test

import (
	"context"
	"fmt"

	"github.com/ucpx/ucpx/condition"
	"github.com/ucpx/ucpx/stream"
	"github.com/ucpx/ucpx/ucp"
)

// A receive enqueued on a stream: the host function enqueued after it runs only once
// the message is in the buffer.
func Example() {
	backend := stream.NewHostBackend() // stream.Open(stream.Auto) picks CUDA where present
	defer backend.Close()
	s, _ := backend.NewStream()
	defer s.Close()
	cond, _ := condition.Create(condition.Param{Category: condition.Stream, Backend: backend, Stream: s})

	uctx, _ := ucp.NewContext(ucp.ContextParams{})
	defer uctx.Close()
	sender, _ := uctx.NewWorker(ucp.WorkerParams{})
	receiver, _ := uctx.NewWorker(ucp.WorkerParams{})
	addr, _ := receiver.Address()
	ep, _ := sender.ConnectAddress(addr, &ucp.EndpointParams{NoPeerErrorHandling: true})

	buf := make([]byte, 5)
	recv, _ := receiver.TagRecvNbx(buf, 7, ^uint64(0), &ucp.RequestParam{Condition: cond})
	_ = s.LaunchHostFunc(func() { fmt.Printf("stream sees %q\n", buf) })

	send, _ := ep.TagSendNbx([]byte("hello"), 7, nil)
	_ = send.Wait(context.Background())
	_ = s.Synchronize()
	fmt.Println("request:", recv.Err(), recv.Length())
	_ = cond.Destroy()
	// Output:
	// stream sees "hello"
	// request: <nil> 5
}
