package prepare_test

import (
	"context"
	"fmt"

	"github.com/ucpx/ucpx/prepare"
	"github.com/ucpx/ucpx/ucp"
)

// A partitioned transfer between two workers of one process: prepared once, then each
// iteration is a Start on both sides, a Pready per partition, and a Wait.
func Example() {
	ctxS, _ := ucp.NewContext(ucp.ContextParams{})
	defer ctxS.Close()
	ctxR, _ := ucp.NewContext(ucp.ContextParams{})
	defer ctxR.Close()
	ws, _ := ctxS.NewWorker(ucp.WorkerParams{})
	wr, _ := ctxR.NewWorker(ucp.WorkerParams{})
	addrS, _ := ws.Address()
	addrR, _ := wr.Address()
	toR, _ := ws.ConnectAddress(addrR, &ucp.EndpointParams{NoPeerErrorHandling: true})
	toS, _ := wr.ConnectAddress(addrS, &ucp.EndpointParams{NoPeerErrorHandling: true})

	sbuf, rbuf := make([]byte, 4*1024), make([]byte, 4*1024)
	send, err := prepare.PsendInit(ws, sbuf, prepare.Params{Peer: toR, Tag: 1, Partitions: 4})
	if err != nil {
		fmt.Println(err)
		return
	}
	recv, err := prepare.PrecvInit(wr, rbuf, prepare.Params{Peer: toS, Tag: 1, Partitions: 4})
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx := context.Background()
	// Both sides prepare (each side in its own process, normally).
	done := make(chan error)
	go func() { done <- prepare.PrepareAll(ctx, recv) }()
	if err := prepare.PrepareAll(ctx, send); err != nil {
		fmt.Println(err)
		return
	}
	<-done

	for iter := 1; iter <= 3; iter++ {
		_ = recv.Start()
		_ = send.Start()
		for p := 3; p >= 0; p-- { // any order
			sbuf[p*1024] = byte(iter*10 + p)
			_ = send.Pready(p)
		}
		go func() { done <- send.Wait(ctx) }()
		_ = recv.Wait(ctx)
		<-done
		fmt.Println(iter, rbuf[0], rbuf[1024], rbuf[2048], rbuf[3072])
	}
	fmt.Println("matches:", send.Stats().TagMatches, recv.Stats().TagMatches)
	_ = send.Free()
	_ = recv.Free()
	// Output:
	// 1 10 11 12 13
	// 2 20 21 22 23
	// 3 30 31 32 33
	// matches: 1 1
}
