package ucp_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ucpx/ucpx/ucp"
)

// Two workers in one process exchange a tagged message over shared memory.
func Example() {
	uctx, err := ucp.NewContext(ucp.ContextParams{})
	if err != nil {
		panic(err)
	}
	defer uctx.Close()
	sender, _ := uctx.NewWorker(ucp.WorkerParams{})
	receiver, _ := uctx.NewWorker(ucp.WorkerParams{})

	addr, _ := receiver.Address()
	ep, err := sender.ConnectAddress(addr, &ucp.EndpointParams{NoPeerErrorHandling: true})
	if err != nil {
		panic(err)
	}

	buf := make([]byte, 64)
	recv, _ := receiver.TagRecvNbx(buf, 42, ^uint64(0), nil)
	send, _ := ep.TagSendNbx([]byte("hello, ucx"), 42, nil)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := send.Wait(ctx); err != nil {
		panic(err)
	}
	if err := recv.Wait(ctx); err != nil {
		panic(err)
	}
	fmt.Printf("%s (tag %d, %d bytes)\n", buf[:recv.Length()], recv.SenderTag(), recv.Length())
	// Output: hello, ucx (tag 42, 10 bytes)
}

// A receive into a buffer that is too small completes with ErrMessageTruncated.
func ExampleWorker_TagRecvNbx_truncated() {
	uctx, _ := ucp.NewContext(ucp.ContextParams{})
	defer uctx.Close()
	a, _ := uctx.NewWorker(ucp.WorkerParams{})
	b, _ := uctx.NewWorker(ucp.WorkerParams{})
	addr, _ := b.Address()
	ep, _ := a.ConnectAddress(addr, &ucp.EndpointParams{NoPeerErrorHandling: true})

	recv, _ := b.TagRecvNbx(make([]byte, 4), 1, ^uint64(0), nil)
	_, _ = ep.TagSendNbx([]byte("too long for four bytes"), 1, nil)
	err := recv.Wait(context.Background())
	fmt.Println(errors.Is(err, ucp.ErrMessageTruncated))
	// Output: true
}
