package protocol

import (
	"errors"
	"os/exec"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

type uuidDev [16]byte

func (u uuidDev) UUID() ([16]byte, error) { return u, nil }

type failingDev struct{}

func (failingDev) UUID() ([16]byte, error) { return [16]byte{}, errors.New("no driver") }

func TestIPCReachDecisionTable(t *testing.T) {
	boot1, boot2 := [16]byte{1}, [16]byte{2}
	ns1, ns2 := [2]uint64{3, 100}, [2]uint64{3, 101}
	gpuA, gpuB := [16]byte{0xa}, [16]byte{0xb}
	canReachB := func(d [16]byte) bool { return d == gpuB }
	id := func(boot [16]byte, ns [2]uint64, dev [16]byte) HostIdentity {
		return HostIdentity{BootID: boot, IPCNamespace: ns, Device: dev}
	}
	for _, tc := range []struct {
		name        string
		local, peer HostIdentity
		access      func([16]byte) bool
		want        Reach
	}{
		{"same GPU", id(boot1, ns1, gpuA), id(boot1, ns1, gpuA), nil, ReachSameDevice},
		{"peer GPU with access", id(boot1, ns1, gpuA), id(boot1, ns1, gpuB), canReachB, ReachPeerDevice},
		{"peer GPU, no access", id(boot1, ns1, gpuA), id(boot1, ns1, gpuB), nil, ReachNoPeerAccess},
		{"peer GPU, access to another", id(boot1, ns1, gpuB), id(boot1, ns1, gpuA), canReachB, ReachNoPeerAccess},
		{"other host", id(boot1, ns1, gpuA), id(boot2, ns1, gpuA), nil, ReachOtherHost},
		{"other namespace", id(boot1, ns1, gpuA), id(boot1, ns2, gpuA), nil, ReachOtherNamespace},
		{"no device here", id(boot1, ns1, [16]byte{}), id(boot1, ns1, gpuA), nil, ReachNone},
		{"no device there", id(boot1, ns1, gpuA), id(boot1, ns1, [16]byte{}), nil, ReachNone},
		{"unknown peer", id(boot1, ns1, gpuA), HostIdentity{}, nil, ReachNone},
	} {
		got := IPCReach(tc.local, tc.peer, tc.access)
		require.Equal(t, tc.want, got, "%s: %v", tc.name, got)
		require.Equal(t, tc.want == ReachSameDevice || tc.want == ReachPeerDevice, got.IPC(), tc.name)
		require.NotContains(t, got.String(), "Reach(", tc.name)
	}
}

func TestLocalHostIdentity(t *testing.T) {
	if runtime.GOOS != "linux" {
		_, err := LocalHostIdentity(nil)
		require.ErrorIs(t, err, ErrUnsupported)
		return
	}
	h, err := LocalHostIdentity(nil)
	require.NoError(t, err)
	require.NotEqual(t, [16]byte{}, h.BootID)
	require.NotZero(t, h.IPCNamespace[1])
	require.Equal(t, [16]byte{}, h.Device)
	g, err := LocalHostIdentity(uuidDev{7})
	require.NoError(t, err)
	require.Equal(t, h.BootID, g.BootID)
	require.Equal(t, [16]byte{7}, g.Device)
	require.Equal(t, ReachSameDevice, IPCReach(g, g, nil))
	_, err = LocalHostIdentity(failingDev{})
	require.Error(t, err)
	// Another process of this machine and namespace sees the same boot id.
	if out, err := exec.Command("cat", "/proc/sys/kernel/random/boot_id").Output(); err == nil {
		id, err := parseBootID(string(out))
		require.NoError(t, err)
		require.Equal(t, h.BootID, id)
	}
	b, err := g.AppendBinary(nil)
	require.NoError(t, err)
	require.Len(t, b, HostIdentitySize)
	back, err := DecodeHostIdentity(b)
	require.NoError(t, err)
	require.Equal(t, g, back)
	_, err = DecodeHostIdentity(b[1:])
	require.ErrorIs(t, err, ErrInvalidParam)
	_, err = parseBootID(strings.Repeat("z", 32))
	require.ErrorIs(t, err, ErrInvalidParam)
}
