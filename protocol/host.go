package protocol

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"syscall"

	"github.com/ucpx/ucpx/internal/errs"
)

// HostIdentity says where a process runs, as far as CUDA IPC cares: which boot of
// which machine, which IPC namespace, which GPU. Peers exchange it once per endpoint
// (in the authenticated handshake) and IPCReach decides from the two whether the
// same-host device path can be used.
type HostIdentity struct {
	// BootID is the kernel's boot id (/proc/sys/kernel/random/boot_id): equal only
	// for processes of one boot of one machine.
	BootID [16]byte
	// IPCNamespace identifies the IPC namespace (/proc/self/ns/ipc: its device and
	// inode). Containers without a shared IPC namespace (docker's --ipc=host) cannot
	// open each other's CUDA IPC handles.
	IPCNamespace [2]uint64
	// Device is the UUID of the CUDA device the process's buffers live on; zero when
	// it has none.
	Device [16]byte
}

// DeviceUUID is what LocalHostIdentity needs of a CUDA device (cuda.Device has it:
// cuDeviceGetUuid_v2).
type DeviceUUID interface {
	UUID() ([16]byte, error)
}

// LocalHostIdentity reads this process's identity; dev (nil for none) is the CUDA
// device its buffers live on. Where /proc does not tell (not Linux), it fails with
// ErrUnsupported: the caller then assumes another host.
func LocalHostIdentity(dev DeviceUUID) (HostIdentity, error) {
	var h HostIdentity
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return h, fmt.Errorf("boot id: %v: %w", err, ErrUnsupported)
	}
	if h.BootID, err = parseBootID(string(b)); err != nil {
		return h, err
	}
	fi, err := os.Stat("/proc/self/ns/ipc")
	if err != nil {
		return h, fmt.Errorf("IPC namespace: %v: %w", err, ErrUnsupported)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return h, fmt.Errorf("IPC namespace: no inode: %w", ErrUnsupported)
	}
	h.IPCNamespace = [2]uint64{uint64(st.Dev), st.Ino}
	if dev != nil {
		if h.Device, err = dev.UUID(); err != nil {
			return h, fmt.Errorf("device UUID: %w", err)
		}
	}
	return h, nil
}

func parseBootID(s string) ([16]byte, error) {
	var id [16]byte
	s = strings.ReplaceAll(strings.TrimSpace(s), "-", "")
	if len(s) != 32 {
		return id, fmt.Errorf("boot id %q: %w", s, ErrInvalidParam)
	}
	if _, err := hex.Decode(id[:], []byte(s)); err != nil {
		return id, fmt.Errorf("boot id %q: %v: %w", s, err, ErrInvalidParam)
	}
	return id, nil
}

// Reach is whether the same-host device path (CUDA IPC) can carry data to a peer.
type Reach int

const (
	// ReachNone: unknown identity, no device on one side.
	ReachNone Reach = iota
	// ReachOtherHost: another machine, or another boot of this one.
	ReachOtherHost
	// ReachOtherNamespace: this machine, but another IPC namespace.
	ReachOtherNamespace
	// ReachNoPeerAccess: both sides' devices are on this host, but the two devices
	// cannot access each other.
	ReachNoPeerAccess
	// ReachSameDevice: one GPU, two processes: CUDA IPC works.
	ReachSameDevice
	// ReachPeerDevice: two GPUs of this host with peer access (NVLink, PCIe P2P).
	ReachPeerDevice
)

// IPC reports whether the reach allows CUDA IPC.
func (r Reach) IPC() bool { return r == ReachSameDevice || r == ReachPeerDevice }

func (r Reach) String() string {
	switch r {
	case ReachNone:
		return "no device path (unknown identity or no device)"
	case ReachOtherHost:
		return "another host"
	case ReachOtherNamespace:
		return "this host, another IPC namespace"
	case ReachNoPeerAccess:
		return "this host, devices without peer access"
	case ReachSameDevice:
		return "this host, the same device"
	case ReachPeerDevice:
		return "this host, a peer device"
	}
	return fmt.Sprintf("Reach(%d)", int(r))
}

// IPCReach decides from two identities whether CUDA IPC can reach the peer.
// peerAccess reports whether this process's device can access the device with the
// peer's UUID (cuDeviceCanAccessPeer after finding it by UUID); nil means it cannot.
func IPCReach(local, peer HostIdentity, peerAccess func(peerDevice [16]byte) bool) Reach {
	var zero [16]byte
	switch {
	case local.BootID == zero || peer.BootID == zero:
		return ReachNone
	case local.BootID != peer.BootID:
		return ReachOtherHost
	case local.IPCNamespace != peer.IPCNamespace:
		return ReachOtherNamespace
	case local.Device == zero || peer.Device == zero:
		return ReachNone
	case local.Device == peer.Device:
		return ReachSameDevice
	case peerAccess != nil && peerAccess(peer.Device):
		return ReachPeerDevice
	}
	return ReachNoPeerAccess
}

// HostIdentitySize is the size of a HostIdentity's encoding.
const HostIdentitySize = 16 + 16 + 16

// AppendBinary appends the identity's fixed-size encoding (for the handshake).
func (h HostIdentity) AppendBinary(b []byte) ([]byte, error) {
	b = append(b, h.BootID[:]...)
	b = binary.LittleEndian.AppendUint64(b, h.IPCNamespace[0])
	b = binary.LittleEndian.AppendUint64(b, h.IPCNamespace[1])
	return append(b, h.Device[:]...), nil
}

// ErrBadHostIdentity: bytes that are not an encoded HostIdentity.
var ErrBadHostIdentity = errs.New("bad host identity", errs.InvalidParam)

// DecodeHostIdentity decodes exactly HostIdentitySize bytes.
func DecodeHostIdentity(b []byte) (HostIdentity, error) {
	var h HostIdentity
	if len(b) != HostIdentitySize {
		return h, fmt.Errorf("%d bytes, want %d: %w", len(b), HostIdentitySize, ErrBadHostIdentity)
	}
	copy(h.BootID[:], b)
	h.IPCNamespace[0] = binary.LittleEndian.Uint64(b[16:])
	h.IPCNamespace[1] = binary.LittleEndian.Uint64(b[24:])
	copy(h.Device[:], b[32:])
	return h, nil
}
