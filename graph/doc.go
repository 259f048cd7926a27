// Package graph holds communication nodes in graphs: the host graph (a DAG of host
// tasks, the CPU twin of a CUDA graph, used where there is no GPU) and the graph nodes
// of graph conditions, which perform an operation each time the graph runs.
//
// A Graph condition (condition.Param{Category: condition.Graph, Graph: g}) adds the
// nodes of one communication node to g; operations enqueued with it as
// RequestParam.Condition run at every launch, with no host call per launch. Host graphs
// (Host, HostExec) launch on host streams; CUDA graphs (CUDA, AdoptCUDA) are launched
// with the driver's own calls and need no host thread while they run.
//
// A host graph made of communication nodes only, in layers (every node depends on all
// nodes of the layers before its own and on nothing else: a relay's receive, then its
// sends), launches as one completion chain (condition.Chain) of the tag operations:
// each layer is posted from the completion callback of the one before, in C, and a
// launch costs about what the same messages cost from a host loop. An operation that
// fails is recorded in its condition (Err) and the layers after it still run, as in any
// launch. In other host graphs, a communication node whose only dependency is another
// communication node starts in the engine's round that completes the first (a relay's
// forward starts as its receive completes), without a pass through the launch. A
// launch that reaches a communication node whose condition carries no operation fails
// with ErrNoOperation; a failed task fails the launch (the stream's sticky error) and
// its dependents do not run. Communication operations such a launch left in flight
// still complete; until they have, later launches of the executable graph fail with
// ErrInFlight rather than take those completions for their own. Like any failed
// launch, that failure is the stream's sticky error: launch again on another stream.
//
// Launches of a graph with communication nodes run one at a time, also when enqueued on
// several streams or made from several executable graphs of the graph (they share the
// nodes' words), as a CUDA graph's launches do. A task that panics or calls runtime.Goexit fails its launch with
// ErrTaskPanicked. A launch waiting for an operation when its stream is closed gives up
// after the stream's close grace (stream.ErrAbandoned), as a blocked stream wait does,
// leaving the operation in flight as above. A launch its stream dropped (the stream
// stopped on an error, or its Close abandoned the launch) is not counted by InFlight.
package graph
