// Command ucpx inspects the UCX installation, measures the ucpx UCP layer against
// ucx_perftest and runs an end-to-end demonstration between two processes.
//
//	ucpx info [--json]           UCX version, transports, memory types, CUDA driver
//	ucpx perf [flags]            ping-pong / streaming benchmarks between two processes
//	ucpx demo [flags]            tag, active-message and RMA exchange with a peer process
//	ucpx trace summarize FILE    per-phase percentiles of a trace (UCPX_TRACE=FILE)
//	ucpx launch -n N -- cmd      start N local ranks of a job (UCPX_RANK, UCPX_SIZE, UCPX_RENDEZVOUS)
//	ucpx demo-ring [flags]       one rank of a checksummed ring allgather (under launch)
//	ucpx keygen [-o FILE]        write an auth key file for UCPX_AUTH_KEY_FILE
//	ucpx help [command]          usage
//
// perf and demo start their peer by re-executing this binary with a hidden
// subcommand (perf-peer, demo-peer).
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
)

// reexecEnv marks a process started by ucpx as its own peer. Tests use it to route a
// re-executed test binary to dispatch instead of the test runner.
const reexecEnv = "UCPX_REEXEC"

type command struct {
	name    string
	summary string
	hidden  bool
	run     func(args []string, stdout, stderr io.Writer) int
}

var commands []command

func init() {
	commands = []command{
		{name: "info", summary: "print the UCX version, transports and devices, memory types and CUDA driver status", run: runInfo},
		{name: "perf", summary: "measure tag latency, tag bandwidth and put bandwidth between two processes", run: runPerf},
		{name: "demo", summary: "exchange tagged messages, active messages and an RMA put with a peer process, verified", run: runDemo},
		{name: "trace", summary: "summarize a trace of conditioned operations: ucpx trace summarize FILE (UCPX_TRACE=FILE writes one)", run: runTrace},
		{name: "launch", summary: "start N local ranks of a command with UCPX_RANK/UCPX_SIZE/UCPX_RENDEZVOUS set: ucpx launch -n N -- cmd", run: runLaunch},
		{name: "demo-ring", summary: "one rank of a checksummed ring allgather (run it under ucpx launch)", run: runDemoRing},
		{name: "keygen", summary: "write a new auth key file (ucpx keygen -o FILE); processes read it through UCPX_AUTH_KEY_FILE", run: runKeygen},
		{name: "perf-peer", hidden: true, run: runPerfPeer},
		{name: "demo-peer", hidden: true, run: runDemoPeer},
	}
}

func main() {
	os.Exit(dispatch(os.Args[1:], ucxLogToStderr(), os.Stderr))
}

// dispatch runs the subcommand named by args[0] and returns the exit status.
func dispatch(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return 2
	}
	name, rest := args[0], args[1:]
	switch name {
	case "help", "-h", "-help", "--help":
		return runHelp(rest, stdout, stderr)
	}
	for _, c := range commands {
		if c.name == name {
			return c.run(rest, stdout, stderr)
		}
	}
	fmt.Fprintf(stderr, "ucpx: unknown command %q\n\n", name)
	usage(stderr)
	return 2
}

func usage(w io.Writer) {
	fmt.Fprintf(w, "usage: ucpx <command> [flags]\n\ncommands:\n")
	visible := make([]command, 0, len(commands))
	for _, c := range commands {
		if !c.hidden {
			visible = append(visible, c)
		}
	}
	sort.Slice(visible, func(i, j int) bool { return visible[i].name < visible[j].name })
	width := len("help")
	for _, c := range visible {
		width = max(width, len(c.name))
	}
	for _, c := range visible {
		fmt.Fprintf(w, "  %-*s %s\n", width, c.name, c.summary)
	}
	fmt.Fprintf(w, "  %-*s %s\n", width, "help", helpSummary)
}

const helpSummary = "show usage of a command: ucpx help <command>"

func runHelp(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stdout)
		return 0
	}
	if args[0] == "help" {
		fmt.Fprintf(stdout, "usage: ucpx help [command]\n\n%s; without one, list the commands.\n", helpSummary)
		return 0
	}
	for _, c := range commands {
		if c.name == args[0] && !c.hidden {
			return c.run([]string{"-h"}, stdout, stdout)
		}
	}
	fmt.Fprintf(stderr, "ucpx help: unknown command %q\n", args[0])
	return 2
}

// newFlagSet returns a FlagSet that reports errors instead of exiting, writing usage
// to w.
func newFlagSet(name, synopsis string, w io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("ucpx "+name, flag.ContinueOnError)
	fs.SetOutput(w)
	fs.Usage = func() {
		fmt.Fprintf(w, "usage: ucpx %s %s\n\nflags:\n", name, synopsis)
		fs.PrintDefaults()
	}
	return fs
}

// parseFlags parses args; it returns (status, false) when the command must stop:
// 0 after -h, 2 after a bad flag or a stray argument.
func parseFlags(fs *flag.FlagSet, args []string) (int, bool) {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0, false
		}
		return 2, false
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(fs.Output(), "%s: unexpected argument %q\n", fs.Name(), strings.Join(fs.Args(), " "))
		fs.Usage()
		return 2, false
	}
	return 0, true
}
