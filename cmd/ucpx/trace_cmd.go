package main

import (
	"fmt"
	"io"
	"os"

	"github.com/ucpx/ucpx/trace"
)

// runTrace is `ucpx trace summarize FILE`: per-phase latency percentiles of a trace
// written with UCPX_TRACE or ucp.Worker.Trace, so a trace answers "where did the time
// go" without a browser.
func runTrace(args []string, stdout, stderr io.Writer) int {
	const usage = "usage: ucpx trace summarize FILE\n\nFILE is Chrome trace JSON written with UCPX_TRACE=FILE (or ucp.Worker.Trace);\nopen it in ui.perfetto.dev or chrome://tracing for the timeline. Percentiles are\nby nearest rank: the smallest duration with at least that share at or below it.\n"
	isHelp := func(a string) bool { return a == "-h" || a == "-help" || a == "--help" }
	if (len(args) == 1 && isHelp(args[0])) || (len(args) == 2 && args[0] == "summarize" && isHelp(args[1])) {
		fmt.Fprint(stdout, usage) // asked for: not a usage error
		return 0
	}
	if len(args) != 2 || args[0] != "summarize" {
		fmt.Fprint(stderr, usage)
		return 2
	}
	f, err := os.Open(args[1])
	if err != nil {
		fmt.Fprintf(stderr, "ucpx trace: %v\n", err)
		return 1
	}
	defer f.Close()
	s, err := trace.ReadSummary(f) // an event at a time: a long run's trace is large
	if err != nil {
		fmt.Fprintf(stderr, "ucpx trace: %s: %v\n", args[1], err)
		return 1
	}
	if s.Ops == 0 {
		fmt.Fprintf(stderr, "ucpx trace: %s holds no operation timelines\n", args[1])
		return 1
	}
	fmt.Fprint(stdout, s)
	return 0
}
