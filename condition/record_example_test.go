package condition_test

import (
	"context"
	"fmt"

	"github.com/ucpx/ucpx/condition"
	"github.com/ucpx/ucpx/stream"
	"github.com/ucpx/ucpx/ucp"
)

// An event for a stream the library never saw: recorded right after the receive is
// enqueued, it is ready only once the message is in the buffer, and another stream
// (a framework's) waits on it with its own WaitEvent (cuStreamWaitEvent on CUDA).
func ExampleCondition_RecordEvent() {
	backend := stream.NewHostBackend()
	defer backend.Close()
	s, _ := backend.NewStream()
	defer s.Close()
	other, _ := backend.NewStream() // the framework's stream
	defer other.Close()
	cond, _ := condition.Create(condition.Param{Category: condition.Stream, Backend: backend, Stream: s})

	uctx, _ := ucp.NewContext(ucp.ContextParams{})
	defer uctx.Close()
	sender, _ := uctx.NewWorker(ucp.WorkerParams{})
	receiver, _ := uctx.NewWorker(ucp.WorkerParams{})
	addr, _ := receiver.Address()
	ep, _ := sender.ConnectAddress(addr, &ucp.EndpointParams{NoPeerErrorHandling: true})

	buf := make([]byte, 5)
	recv, _ := receiver.TagRecvNbx(buf, 7, ^uint64(0), &ucp.RequestParam{Condition: cond, Flags: ucp.NonBlockingEnqueue})
	ev, _ := backend.NewEvent()
	_ = recv.RecordEvent(ev) // or cond.RecordEvent(ev): everything armed so far
	ready, _ := ev.Query()
	fmt.Println("ready before the send:", ready)

	_ = other.WaitEvent(ev)
	_ = other.LaunchHostFunc(func() { fmt.Printf("the other stream sees %q\n", buf) })
	send, _ := ep.TagSendNbx([]byte("hello"), 7, nil)
	_ = send.Wait(context.Background())
	_ = other.Synchronize()
	_ = recv.Wait(context.Background())
	_ = ev.Close()
	_ = s.Synchronize()
	_ = cond.Destroy()
	// Output:
	// ready before the send: false
	// the other stream sees "hello"
}
