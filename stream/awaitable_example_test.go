package stream_test

import (
	"fmt"

	"github.com/ucpx/ucpx/stream"
)

// A device-to-host copy as an awaitable (on a host stream here; on a CUDA stream src is
// device memory and dst pinned host memory): the call returns at once and Bytes waits
// for the copy's own event, not for later work on the stream.
func ExampleCopyToHostAsync() {
	b := stream.NewHostBackend()
	defer b.Close()
	s, _ := b.NewStream()
	defer s.Close()
	words, _ := b.AllocWords(2) // C memory: the source and the destination word
	defer words.Close()
	words.Word(0).Store(0x2a)

	a, err := stream.CopyToHostAsync(s, words.Word(1).HostPtr(), words.Word(0).HostPtr(), 8)
	if err != nil {
		fmt.Println(err)
		return
	}
	data, err := a.Bytes()
	fmt.Println(data[0], err, words.Word(1).Load())
	// Output: 42 <nil> 42
}
