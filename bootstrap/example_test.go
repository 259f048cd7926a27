package bootstrap_test

import (
	"context"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/ucpx/ucpx/bootstrap"
	"github.com/ucpx/ucpx/ucp"
)

// Two ranks of a job, here goroutines of one process (normally processes started by
// `ucpx launch` or a scheduler, each calling bootstrap.FromEnv): rank 1 passes a value
// through the store, rank 0 then sends rank 1 a tagged message over the endpoint it
// creates on first use, and both meet at a barrier before leaving.
func Example() {
	ln, _ := net.Listen("tcp", "127.0.0.1:0") // a free port for rank 0's rendezvous
	rdv := ln.Addr().String()
	_ = ln.Close()
	key := bootstrap.NewKey() // normally the file UCPX_AUTH_KEY_FILE names
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	var wg sync.WaitGroup
	for rank := 0; rank < 2; rank++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Busy-polling workers: two workers of one process parked on their event fds
			// were seen to miss the wakeup of a first tcp wire-up and wait out ctx (about
			// one run in three; a ucp issue, reported).
			opts := &bootstrap.Options{Key: key, WorkerParams: ucp.WorkerParams{NoWakeup: true}}
			job, err := bootstrap.New(ctx, bootstrap.Config{Rank: rank, Size: 2, Rendezvous: rdv}, opts)
			if err != nil {
				fmt.Println(err)
				return
			}
			defer job.Close()
			if job.Rank == 1 {
				_ = job.Store().Set(ctx, "greeting", []byte("hello from rank 1"))
				buf := make([]byte, 64)
				recv, _ := job.Worker().TagRecvNbx(buf, 7, ^uint64(0), nil)
				_ = recv.Wait(ctx)
				fmt.Printf("rank 1 got %q\n", buf[:recv.Length()])
			} else {
				v, _ := job.Store().Wait(ctx, "greeting")
				fmt.Printf("rank 0 read %q\n", v)
				ep, _ := job.Endpoint(1)
				send, _ := ep.TagSendNbx([]byte("hi rank 1"), 7, nil)
				_ = send.Wait(ctx)
			}
			_ = job.Barrier(ctx)
		}()
	}
	wg.Wait()
	// Output:
	// rank 0 read "hello from rank 1"
	// rank 1 got "hi rank 1"
}
