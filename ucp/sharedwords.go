package ucp

import (
	"encoding/binary"
	"fmt"
	"sync/atomic"

	"github.com/ucpx/ucpx/cgo/ucx"
	"github.com/ucpx/ucpx/protocol"
	"github.com/ucpx/ucpx/stream/streamcore"
)

// Shared signal words: with ContextParams.Device, Signals of a backend that
// implements streamcore.DeviceIPC live in a shared memory segment
// (AllocSharedWords), registered with UCX as before. Their packed key carries, beside
// UCX's key, the segment's file descriptor; a same-host peer that CUDA IPC reaches
// maps the segment in UnpackRkey (MapSharedWords, with the pid its authenticated
// handshake gave), so the signal of its PutSignalNbx on a device region becomes a
// stream write into the shared page right after the copy: the whole put-with-signal
// is GPU work, and the words stay host memory that this process's CPU can always
// write (a wait on them never outlives a peer that died). Peers elsewhere, and every
// other operation on the key, use UCX's key.

// An IPC payload whose first byte after the mark is sharedWordsTag (never an
// IPCMessage version) is shared words: the tag, the segment's fd (4 bytes) and size
// (8), then UCX's packed key.
const (
	sharedWordsTag   = 0x80
	sharedWordsFixed = ipcPayloadMark + 1 + 4 + 8
)

func sharedWordsPayload(sw streamcore.SharedWords, ucxKey []byte) []byte {
	b := make([]byte, ipcPayloadMark, sharedWordsFixed+len(ucxKey))
	b = append(b, sharedWordsTag)
	b = binary.LittleEndian.AppendUint32(b, uint32(sw.FD))
	b = binary.LittleEndian.AppendUint64(b, uint64(sw.Size))
	return append(b, ucxKey...)
}

func isSharedWordsPayload(p []byte) bool {
	return isIPCPayload(p) && len(p) > ipcPayloadMark && p[ipcPayloadMark] == sharedWordsTag
}

// decodeSharedWordsPayload splits a shared-words payload; the region must lie at the
// start of the segment (Signals are the whole segment).
func decodeSharedWordsPayload(p []byte, length uint64) (streamcore.SharedWords, []byte, error) {
	if len(p) < sharedWordsFixed {
		return streamcore.SharedWords{}, nil, fmt.Errorf("shared words key of %d bytes: %w", len(p), ErrInvalidParam)
	}
	fd := binary.LittleEndian.Uint32(p[ipcPayloadMark+1:])
	size := binary.LittleEndian.Uint64(p[ipcPayloadMark+5:])
	if fd > 1<<30 || size == 0 || size > 1<<30 || length > size {
		return streamcore.SharedWords{}, nil, fmt.Errorf("shared words key: fd %d, %d bytes for a %d-byte region: %w", fd, size, length, ErrInvalidParam)
	}
	inner := p[sharedWordsFixed:]
	if err := checkRkeyPayload(inner); err != nil {
		return streamcore.SharedWords{}, nil, err
	}
	return streamcore.SharedWords{FD: int(fd), Size: int(size)}, inner, nil
}

// allocSignalWords is where NewSignals' words come from: shared when the context has a
// Device and b can map host memory for its device.
func (w *Worker) allocSignalWords(b streamcore.Backend, n int) (*streamcore.WordBlock, *streamcore.SharedWords, error) {
	if d, ok := b.(streamcore.DeviceIPC); ok && w.ctx.ipc != nil {
		block, sw, err := d.AllocSharedWords(n)
		if err != nil {
			return nil, nil, err
		}
		return block, &sw, nil
	}
	block, err := b.AllocWords(n)
	return block, nil, err
}

// mapSharedWords maps a peer's shared words for the key being unpacked, where CUDA IPC
// reaches the peer and its pid names the same process here (one pid namespace).
// Anything that does not work leaves the key on UCX alone (nil). A driver call: the
// caller's goroutine, no lock held.
func (ep *Endpoint) mapSharedWords(sw streamcore.SharedWords) *rkeyIPC {
	c := ep.w.ctx
	if c.ipc == nil || !ep.peerKnown || ep.peer.boot != c.trust.boot || ep.peer.pid == 0 {
		return nil
	}
	if !ep.Reach(c.ipc.dev.CanAccessPeer).IPC() {
		return nil
	}
	host, dev, unmap, err := c.ipc.dev.MapSharedWords(int(ep.peer.pid), sw)
	if err != nil {
		return nil
	}
	return &rkeyIPC{mapped: dev, host: host, unmap: unmap}
}

// sharedStore reports whether a put into r goes as CPU stores into the peer's shared
// words mapped here (storeShared): host memory (declared, or a host MemH), no
// condition, nothing staged. The words are shared memory: the stores land at once,
// with no UCX and no progress of the peer's (a peer whose streams or graphs alone wait
// on the words has no CPU that would progress).
func (r *Rkey) sharedStore(p *RequestParam) bool {
	if r == nil || r.shared == nil || r.shared.host == 0 || p.Condition != nil {
		return false
	}
	host := p.MemoryType == MemoryHost || (p.MemoryType == MemoryUnknown && p.MemH != nil && p.MemH.memType == MemoryHost)
	return host && p.Staging.Or(r.ep.w.ctx.protocol.Staging) != protocol.StageAlways
}

// storeShared writes buf at raddr of the peer's shared words by CPU stores: each
// aligned 8-byte word in one store (a signal word is never seen torn), the rest
// bytewise. The caller checked the key and the range under the worker's lock, which
// keeps the mapping.
func (r *Rkey) storeShared(raddr uint64, buf []byte) {
	dst := r.shared.host + uintptr(raddr-r.base)
	for i := 0; i < len(buf); {
		if (dst+uintptr(i))%8 == 0 && len(buf)-i >= 8 {
			atomic.StoreUint64((*uint64)(ucx.Addr(dst+uintptr(i))), binary.NativeEndian.Uint64(buf[i:]))
			i += 8
			continue
		}
		*(*byte)(ucx.Addr(dst + uintptr(i))) = buf[i]
		i++
	}
}

// release gives a mapping back: a shared segment is unmapped, a device allocation's
// reference returned to the importer. Off any lock: both may wait for the device.
func (x *rkeyIPC) release(c *Context) {
	if x.gone != nil {
		defer close(x.gone)
	}
	if x.unmap != nil {
		_ = x.unmap()
		return
	}
	_ = c.ipc.imp.Release(x.peer, x.alloc)
}

// takeMappingsLocked takes the key's mapping references (device region, shared
// words) for their one release each.
func (r *Rkey) takeMappingsLocked() []*rkeyIPC {
	var out []*rkeyIPC
	for _, x := range [...]*rkeyIPC{r.ipc, r.shared} {
		if x != nil && x.gone == nil {
			x.gone = make(chan struct{})
			out = append(out, x)
		}
	}
	return out
}

// signalAddr is where a stream writes the signal word at the peer's raddr: in a
// mapped device region or in mapped shared words (0 if neither).
func (r *Rkey) signalAddr(raddr uint64) uintptr {
	switch {
	case r.ipc != nil:
		return r.ipc.mapped + uintptr(raddr-r.base)
	case r.shared != nil:
		return r.shared.mapped + uintptr(raddr-r.base)
	}
	return 0
}
