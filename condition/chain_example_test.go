package condition_test

import (
	"context"
	"fmt"
	"time"

	"github.com/ucpx/ucpx/condition"
	"github.com/ucpx/ucpx/ucp"
)

// A ping-pong built from two chains: the responder's receive completing posts its
// reply, the initiator's send completing posts its receive, each from the UCX
// completion callback, with no Go code between the operations of the 1000 round trips.
func ExampleChain() {
	uctx, _ := ucp.NewContext(ucp.ContextParams{})
	defer uctx.Close()
	a, _ := uctx.NewWorker(ucp.WorkerParams{})
	b, _ := uctx.NewWorker(ucp.WorkerParams{})
	addrA, _ := a.Address()
	addrB, _ := b.Address()
	noPeerErr := &ucp.EndpointParams{NoPeerErrorHandling: true}
	toB, _ := a.ConnectAddress(addrB, noPeerErr)
	toA, _ := b.ConnectAddress(addrA, noPeerErr)

	const rounds = 1000
	ping, reply, echo := []byte("ping"), make([]byte, 4), make([]byte, 4)
	initiator, _ := condition.NewChain(condition.ChainParam{Repeat: rounds})
	responder, _ := condition.NewChain(condition.ChainParam{Repeat: rounds})
	// Initiator: [send ping] then [receive the reply].
	_, _ = toB.TagSendNbx(ping, 1, &ucp.RequestParam{Chain: initiator})
	_ = initiator.Then()
	_, _ = a.TagRecvNbx(reply, 2, ^uint64(0), &ucp.RequestParam{Chain: initiator})
	// Responder: [receive] then [send back what arrived].
	_, _ = b.TagRecvNbx(echo, 1, ^uint64(0), &ucp.RequestParam{Chain: responder})
	_ = responder.Then()
	_, _ = toA.TagSendNbx(echo, 2, &ucp.RequestParam{Chain: responder})

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_ = responder.Start()
	_ = initiator.Start()
	done := make(chan error, 1)
	go func() { done <- responder.Wait(ctx) }() // each worker is driven by its own waiter
	if err := initiator.Wait(ctx); err != nil {
		panic(err)
	}
	if err := <-done; err != nil {
		panic(err)
	}
	fmt.Printf("%d round trips, reply %q\n", initiator.Iterations(), reply)
	_ = initiator.Destroy()
	_ = responder.Destroy()
	// Output: 1000 round trips, reply "ping"
}
