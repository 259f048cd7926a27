package ucp_test

import (
	"context"
	"fmt"
	"time"

	"github.com/ucpx/ucpx/stream"
	"github.com/ucpx/ucpx/ucp"
)

// A put with signal: the receiver learns that the data landed from its signal word.
// SignalStore writes the word with a put after the data (no atomic). The receiver only
// serves one-sided operations, so its worker progresses itself (ProgressThread).
func ExampleEndpoint_PutSignalNbx() {
	uctx, err := ucp.NewContext(ucp.ContextParams{})
	if err != nil {
		panic(err)
	}
	defer uctx.Close()
	sender, _ := uctx.NewWorker(ucp.WorkerParams{})
	receiver, _ := uctx.NewWorker(ucp.WorkerParams{ProgressThread: true})
	defer receiver.Close()
	addr, _ := receiver.Address()
	ep, err := sender.ConnectAddress(addr, &ucp.EndpointParams{NoPeerErrorHandling: true})
	if err != nil {
		panic(err)
	}

	// The receiver's buffer and signal word, and their keys as the sender unpacks them.
	host, _ := stream.Open(stream.Host)
	defer host.Close()
	data, _ := uctx.MemAlloc(64)
	defer data.Close()
	sigs, _ := receiver.NewSignals(host, 1)
	defer sigs.Close()
	packed, _ := data.PackRkey()
	dataKey, _ := ep.UnpackRkey(packed)
	packed, _ = sigs.PackRkey()
	sigKey, _ := ep.UnpackRkey(packed)

	msg := []byte("partition 0")
	r, err := ep.PutSignalNbx(msg, dataKey.Base(), dataKey, ucp.Signal{Op: ucp.SignalStore, Value: 1, Addr: sigs.Addr(0), Rkey: sigKey}, nil)
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := r.Wait(ctx); err != nil {
		panic(err)
	}
	// The sender keeps progressing until the receiver has seen the signal: UCX may
	// hold it behind the fence until the sender's next progress call.
	for sigs.Word(0).Load() < 1 && ctx.Err() == nil {
		sender.Progress()
	}
	fmt.Printf("signal %d: %s\n", sigs.Word(0).Load(), data.Bytes()[:len(msg)])
	// Output: signal 1: partition 0
}
