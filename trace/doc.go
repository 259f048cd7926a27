// Package trace records what the engine of conditioned operations did, as Chrome trace
// event JSON that Perfetto (ui.perfetto.dev) and chrome://tracing open: for each
// operation, spans from its enqueue to the trigger the engine saw, the transport issue,
// the transport's completion and the completion store that releases the stream, on one
// track per condition, with the operation's kind, size, sequence number and protocol as
// arguments, and the doorbell rings as instant events. Where the device stamps its
// completion polls (CUDA streams, transfers from 16 KiB), a device track beside the
// condition's shows when the stream reached the poll, when it saw the completion, and
// how long after the engine's store that was (AddDeviceSpan, DeviceTrack).
//
// Tracing is off unless a Recorder is attached: ucp.Worker.Trace for one worker, or
// for every worker of the process the UCPX_TRACE environment variable naming the file
// to write ("{pid}" in it stands for the process id; each engine writes it as it
// closes, when something new was recorded) or UseFile, or Use, a recorder without a
// file that its caller writes once (`ucpx demo --trace` and `ucpx perf --trace`). Off,
// the engine pays one atomic load per round and per operation and allocates nothing.
// A Recorder keeps 72 bytes per operation; WriteJSON writes the events one at a time,
// with memory that does not grow with the trace. Summarize (`ucpx trace summarize
// FILE`, through ReadSummary, which reads a file an event at a time) gives per-phase
// percentiles of a trace: where the time went, without a browser.
package trace
