package prepare

import (
	"fmt"

	"github.com/ucpx/ucpx/stream"
	"github.com/ucpx/ucpx/ucp"
)

// The direct path: a device buffer whose peer CUDA IPC reaches (one host, the
// context's ucp.ContextParams.Device, peer access between the devices) is not
// staged. The receiver registers its buffer as a device region (its key carries the
// allocation's IPC handle) and its arrival counters are Signals of the device backend,
// which such a context puts in shared memory the sender maps. A partition is then one
// ucp put-with-signal on the IPC path: a copy-engine copy into the receiver's mapped
// buffer and a stream write of the iteration into its mapped arrival counter, on the
// stream the partition became ready on (PreadyOnStream), on the worker's stream
// (Pready), or issued by the engine at a kernel's ucpx_pready. Nothing goes through
// host memory, and the receiver's counters stay host memory its CPU can store the
// failure value into. ucp owns the mappings and orders their release after the
// copies (revocation, a dead peer).

// directPath reports whether a request of p on w takes the direct path. Both sides
// decide alike from the endpoint's reach; a peer that cannot map what it gets fails
// in the prepare phase with the reason.
func directPath(w *ucp.Worker, p Params) bool {
	dev := w.Context().Device()
	if p.MemoryType != ucp.MemoryCUDA || dev == nil || p.stage {
		return false
	}
	if _, ok := p.Backend.(stream.DeviceIPC); !ok {
		return false
	}
	return p.Peer.Reach(dev.CanAccessPeer).IPC()
}

// deviceBackend reports whether b holds device buffers' streams: a CUDA backend, or
// one with a device's IPC side.
func deviceBackend(b stream.Backend) bool {
	if b == nil {
		return false
	}
	_, ok := b.(stream.DeviceIPC)
	return ok || b.Kind() == stream.KindCUDA
}

// checkDirectKeysLocked: a direct sender's put-with-signal needs the receiver's buffer
// mapped and its arrival counters reachable by a stream. Caller holds r.mu.
func (r *Request) checkDirectKeysLocked() error {
	bk, wk := r.remote.bufKey, r.remote.wordKey
	if !bk.Device() {
		return nil // a host or staged receiver: ucp moves the device buffer itself
	}
	if _, err := wk.DeviceAddress(r.remote.wordBase, 8*r.parts); err != nil {
		return fmt.Errorf("prepare: the receiver's arrival counters cannot be written by a stream here: %w", err)
	}
	return nil
}
