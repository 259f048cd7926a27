// Package condition links communication operations to points of execution: a stream
// reaching the point where the operation was enqueued (Stream), a node of a graph
// (Graph, built by package graph), or a kernel calling the trigger function with the
// condition's DeviceHandle (KernelTriggered; on host backends a goroutine calls Trigger).
//
// A condition owns two signal words (stream.Word): the trigger word T and the completion
// word D. Every operation enqueued with the condition gets the next sequence number k
// (Arm). For a Stream condition, Arm enqueues "store k into T" on the stream and, for
// stream-ordered completion, "wait until D >= k": work enqueued on the stream later (a
// kernel, a copy, an event record) runs only after the operation completed. The proxy
// engine of package ucp watches T, issues the operations up to it in order, and stores
// into D the highest k up to which every operation has completed (Retire). A failed
// operation still advances D, with the error kept in Err and on its Request, so no
// stream stays blocked on a dead peer.
//
// Operations take a condition through ucp.RequestParam.Condition:
//
//	c, _ := condition.Create(condition.Param{Category: condition.Stream, Backend: b, Stream: s})
//	req, _ := w.TagRecvNbx(buf, tag, mask, &ucp.RequestParam{Condition: c})
//	s.Record(ev) // ready only once buf holds the message
//
// Operations armed between BeginGroup and EndGroup share one trigger and one completion
// wait (like ncclGroupStart/End). An operation enqueued while its stream is being
// captured into a CUDA graph becomes a persistent graph operation (Captured). A Graph
// condition's node may carry several operations; every launch runs them all.
//
// The device-side half of KernelTriggered lives in device/ucpx_signal.cuh; DeviceHandle
// has the layout of its struct ucpx_device_handle.
package condition
