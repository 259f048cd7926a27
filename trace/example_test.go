package trace_test

import (
	"fmt"

	"github.com/ucpx/ucpx/trace"
)

// A recorder collects operation timelines (ucp.Worker.Trace attaches one to a worker's
// engine); Summarize tells where the time went.
func ExampleSummarize() {
	r := trace.NewRecorder()
	r.Record(trace.Op{Track: 1, What: "tag_send_nbx", Seq: 1, Enqueue: 0, Trigger: 2000, Issue: 2300, Done: 4300, Store: 4400})
	s := trace.Summarize(trace.File{TraceEvents: r.Events()})
	for _, p := range s.Phases {
		fmt.Printf("%s %.1f µs\n", p.Phase, p.P50)
	}
	// Output:
	// wait trigger 2.0 µs
	// issue 0.3 µs
	// in flight 2.0 µs
	// store 0.1 µs
}
