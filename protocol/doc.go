// Package protocol decides how an operation's buffer travels: as is, or staged
// through pinned host memory (whole, or in parts that overlap their copies with the
// transfers), and how a stream waits for its completion. The engine of package
// condition asks its Planner once per conditioned operation; package ucp sets it up
// from ucp.ContextParams.Protocol (Config).
//
// # Workspace policy
//
// Staging says when a buffer moves through the staging workspace, per context
// (Config.Staging) and per operation (ucp.RequestParam.Staging, StageDefault taking
// the context's):
//
//   - StageWhenNeeded, the default: only device memory the transport cannot move;
//   - StageAlways: every buffer on a stream, even where a direct path exists (cuDecomp's
//     choice); on host streams host buffers too, which is how CI exercises staging;
//   - StageNever: never; a device buffer with no direct path fails at the call with an
//     error matching ErrUnsupported;
//   - PreferPull: as StageWhenNeeded; tag and active messages of device buffers on
//     the CUDA-IPC path move by the receiver pulling (as under StageWhenNeeded).
//
// Staged operations draw on a pool that grows with demand, or on a Workspace
// (NewWorkspace, Config.Workspace): fixed memory with back-pressure, through which an
// RMA larger than the workspace streams in parts. Stats counts what was staged
// (ucp.Worker.StagingStats).
//
// # CUDA IPC building blocks
//
// IPCExporter and IPCImporter cache CUDA IPC handles and mappings keyed by allocation
// and buffer id, IPCMessage is their wire message, and LocalHostIdentity with IPCReach
// decide whether two processes can use CUDA IPC at all. They reach the driver through
// IPCDriver. Package ucp uses them for its same-host device path (ucp/ipc.go: device
// regions' keys, their mappings in UnpackRkey, copies on streams).
package protocol
