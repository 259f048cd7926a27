package graph_test

import (
	"context"
	"fmt"
	"time"

	"github.com/ucpx/ucpx/condition"
	"github.com/ucpx/ucpx/graph"
	"github.com/ucpx/ucpx/stream"
	"github.com/ucpx/ucpx/ucp"
)

// A relay as a host graph, launched three times: each launch receives a message and
// sends it back. The graph is communication nodes in layers (the receive, then the echo
// that depends on it), so each launch runs as one completion chain: the echo is posted
// from the receive's completion callback, in C.
func ExampleHostExec_Launch() {
	uctx, err := ucp.NewContext(ucp.ContextParams{})
	if err != nil {
		panic(err)
	}
	defer uctx.Close()
	client, _ := uctx.NewWorker(ucp.WorkerParams{})
	relay, _ := uctx.NewWorker(ucp.WorkerParams{})
	noErrHandling := &ucp.EndpointParams{NoPeerErrorHandling: true}
	relayAddr, _ := relay.Address()
	clientAddr, _ := client.Address()
	toRelay, _ := client.ConnectAddress(relayAddr, noErrHandling)
	toClient, _ := relay.ConnectAddress(clientAddr, noErrHandling)

	backend := stream.NewHostBackend()
	defer backend.Close()
	g := graph.NewHost()
	buf := make([]byte, len("ping 0")) // the graph's operations move fixed buffers
	recv, _ := condition.Create(condition.Param{Category: condition.Graph, Backend: backend, Graph: g})
	_, _ = relay.TagRecvNbx(buf, 1, ^uint64(0), &ucp.RequestParam{Condition: recv})
	echo, _ := condition.Create(condition.Param{Category: condition.Graph, Backend: backend, Graph: g,
		Deps: []condition.Node{recv.WaitNode()}})
	_, _ = toClient.TagSendNbx(buf, 2, &ucp.RequestParam{Condition: echo})
	x, err := g.Instantiate()
	if err != nil {
		panic(err)
	}
	s, _ := backend.NewStream()
	defer s.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := range 3 {
		if err := x.Launch(s); err != nil {
			panic(err)
		}
		msg := []byte(fmt.Sprintf("ping %d", i))
		got := make([]byte, len(buf))
		r, _ := client.TagRecvNbx(got, 2, ^uint64(0), nil)
		if err := toRelay.TagSend(ctx, msg, 1); err != nil {
			panic(err)
		}
		if err := r.Wait(ctx); err != nil {
			panic(err)
		}
		fmt.Printf("%s\n", got[:r.Length()])
	}
	if err := s.Synchronize(); err != nil {
		panic(err)
	}
	_ = x.Close()
	_ = recv.Destroy()
	_ = echo.Destroy()
	// Output:
	// ping 0
	// ping 1
	// ping 2
}
