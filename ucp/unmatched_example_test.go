package ucp_test

import (
	"errors"
	"fmt"

	"github.com/ucpx/ucpx/ucp"
)

// A peer that sends tag messages nobody receives is cut off once they hold more than
// the receiver's WorkerParams.UnmatchedLimit: the receiver's endpoint to it fails with
// an *ucp.UnmatchedLimitError, and what it sent unmatched is dropped.
func ExampleWorkerParams_unmatchedLimit() {
	uctx, err := ucp.NewContext(ucp.ContextParams{})
	if err != nil {
		panic(err)
	}
	defer uctx.Close()
	flooder, _ := uctx.NewWorker(ucp.WorkerParams{})
	defer flooder.Close()
	victim, _ := uctx.NewWorker(ucp.WorkerParams{UnmatchedLimit: 256 << 10})
	defer victim.Close()
	fa, _ := flooder.Address()
	va, _ := victim.Address()
	toVictim, err := flooder.ConnectAddress(va, &ucp.EndpointParams{NoPeerErrorHandling: true})
	if err != nil {
		panic(err)
	}
	toFlooder, _ := victim.ConnectAddress(fa, &ucp.EndpointParams{NoPeerErrorHandling: true})

	msg := make([]byte, 4096)
	for i := 0; i < 4096 && toFlooder.Err() == nil; i++ {
		r, err := toVictim.TagSendNbx(msg, 7, nil) // tag 7: nobody receives it
		if err != nil {
			panic(err)
		}
		for !r.Done() {
			flooder.Progress()
			victim.Progress()
		}
		victim.Progress()
	}
	var cut *ucp.UnmatchedLimitError
	err = toFlooder.Err()
	fmt.Println(errors.Is(err, ucp.ErrExceedsLimit), errors.As(err, &cut) && cut.Held > cut.Limit)
	// Output: true true
}
