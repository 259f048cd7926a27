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

// A group: a receive and a send on one stream start together when the stream reaches
// EndGroup's point, and the stream waits once for both (MPIX Irecv_enqueue,
// Isend_enqueue, Waitall_enqueue).
func ExampleCondition_BeginGroup() {
	backend := stream.NewHostBackend()
	defer backend.Close()
	s, _ := backend.NewStream()
	defer s.Close()
	cond, _ := condition.Create(condition.Param{Category: condition.Stream, Backend: backend, Stream: s})

	uctx, _ := ucp.NewContext(ucp.ContextParams{})
	defer uctx.Close()
	a, _ := uctx.NewWorker(ucp.WorkerParams{})
	b, _ := uctx.NewWorker(ucp.WorkerParams{})
	addrA, _ := a.Address()
	addrB, _ := b.Address()
	toB, _ := a.ConnectAddress(addrB, &ucp.EndpointParams{NoPeerErrorHandling: true})
	toA, _ := b.ConnectAddress(addrA, &ucp.EndpointParams{NoPeerErrorHandling: true})

	// b answers every ping with a pong, driven from the host.
	ping, pong := make([]byte, 4), make([]byte, 4)
	peerRecv, _ := b.TagRecvNbx(ping, 1, ^uint64(0), nil)

	_ = cond.BeginGroup()
	_, _ = a.TagRecvNbx(pong, 2, ^uint64(0), &ucp.RequestParam{Condition: cond})
	_, _ = toB.TagSendNbx([]byte("ping"), 1, &ucp.RequestParam{Condition: cond})
	_ = cond.EndGroup()
	_ = s.LaunchHostFunc(func() { fmt.Printf("stream sees %q\n", pong) })

	_ = peerRecv.Wait(context.Background())
	reply, _ := toA.TagSendNbx([]byte("pong"), 2, nil)
	_ = reply.Wait(context.Background())
	_ = s.Synchronize()
	fmt.Println("pending:", cond.Pending())
	_ = cond.Destroy()
	// Output:
	// stream sees "pong"
	// pending: 0
}
