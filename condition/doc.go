// Package condition links communication operations to points of execution: a stream
// reaching the point where the operation was enqueued (Stream), a node of a graph
// (Graph, built by package graph), or a kernel calling the trigger function with the
// condition's DeviceHandle (KernelTriggered; on host backends a goroutine calls Trigger).
//
// A condition owns three signal words (stream.Word): the trigger word T, the completion
// word D and, beside D, a status word telling which operation failed last (StatusAt,
// ucpx_status). Every operation enqueued with the condition (an nbx call with
// RequestParam.Condition) gets the next sequence number k. For a Stream condition, its
// enqueue puts "store k into T" on the stream and, for
// stream-ordered completion, "wait until D >= k": work enqueued on the stream later (a
// kernel, a copy, an event record) runs only after the operation completed. The
// Engine (one per ucp.Worker, the proxy) watches T, issues the operations up to it in
// order, and stores into D the highest k up to which every operation has completed. A
// failed operation still advances D, with the error kept in Err (until ClearErr) and
// on its Request, so no stream stays blocked on a dead peer. Nothing exported stores
// into T or D but the trigger calls (Trigger, and ucpx_trigger on the device).
//
// Operations take a condition through ucp.RequestParam.Condition:
//
//	c, _ := condition.Create(condition.Param{Category: condition.Stream, Backend: b, Stream: s})
//	req, _ := w.TagRecvNbx(buf, tag, mask, &ucp.RequestParam{Condition: c})
//	s.Record(ev) // ready only once buf holds the message
//
// A condition serves the operations of one worker: the engine of the worker whose
// operation it carried first retires its operations, and an operation of another
// worker on it is refused (ErrInvalidParam; use a condition per worker). Only once
// that worker closed, with every operation retired, does another worker's operation
// bind it again (not a Graph condition's: it can run no more then).
//
// Operations armed between BeginGroup and EndGroup share one trigger and one completion
// wait (like ncclGroupStart/End). An operation enqueued while its stream is being
// captured into a CUDA graph becomes a persistent graph operation, on a Graph
// condition of its own that lives until the Stream condition is destroyed (ucpx is
// not told when the captured graph goes): a long-lived Stream condition grows by one
// per captured operation, so use a Stream condition per capture where captures
// repeat. A Graph condition's
// node may carry several operations; every launch runs them all.
//
// The engine's side: a transport (package ucp) implements Operation and Transport and
// hands each operation over with Engine.Submit; the engine asks package protocol how
// the operation's buffer travels (staging device memory where the transport cannot
// move it) and calls Operation.Issue once the trigger reached it.
//
// The device-side half of KernelTriggered lives in device/ucpx_signal.cuh; DeviceHandle
// has the layout of its struct ucpx_device_handle.
package condition
