package protocol_test

import (
	"fmt"

	"github.com/ucpx/ucpx/protocol"
	"github.com/ucpx/ucpx/stream"
)

// On host streams every buffer is host memory and nothing needs staging; on a CUDA
// backend the same calls classify device memory and lend pinned buffers.
func ExampleStager() {
	backend, _ := stream.Open(stream.Host)
	defer backend.Close()
	st := protocol.NewStager(backend)
	defer st.Close()
	buf := make([]byte, 64)
	kind, err := st.Classify(uintptr(len(buf)))
	fmt.Println(kind, err)
	// Output: host <nil>
}
