package ucp_test

import (
	"context"
	"fmt"
	"time"

	"github.com/ucpx/ucpx/protocol"
	"github.com/ucpx/ucpx/ucp"
)

// StageAlways, set per context, moves even host buffers through staging memory
// (cuDecomp's choice, made testable without a GPU); StagingStats shows what was staged.
// StageNever on one operation overrides it.
func ExampleWorker_StagingStats() {
	uctx, _ := ucp.NewContext(ucp.ContextParams{Protocol: protocol.Config{Staging: protocol.StageAlways}})
	defer uctx.Close()
	sender, _ := uctx.NewWorker(ucp.WorkerParams{})
	receiver, _ := uctx.NewWorker(ucp.WorkerParams{})
	addr, _ := receiver.Address()
	ep, _ := sender.ConnectAddress(addr, &ucp.EndpointParams{NoPeerErrorHandling: true})

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	buf := make([]byte, 64)
	recv, _ := receiver.TagRecvNbx(buf, 1, ^uint64(0), nil)
	send, _ := ep.TagSendNbx([]byte("staged"), 1, nil)
	_ = send.Wait(ctx)
	_ = recv.Wait(ctx)
	recv, _ = receiver.TagRecvNbx(buf[8:], 2, ^uint64(0), &ucp.RequestParam{Staging: protocol.StageNever})
	send, _ = ep.TagSendNbx([]byte("as is"), 2, &ucp.RequestParam{Staging: protocol.StageNever})
	_ = send.Wait(ctx)
	_ = recv.Wait(ctx)
	s, r := sender.StagingStats(), receiver.StagingStats()
	fmt.Printf("%s, %s; sender staged %d bytes in %d part, receiver %d bytes\n", buf[:6], buf[8:13], s.Bytes, s.Parts, r.Bytes)
	// Output: staged, as is; sender staged 6 bytes in 1 part, receiver 64 bytes
}
