package ucp

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/protocol"
)

// Endpoint.Reach decides from the identities exchanged at wire-up, through the sealed
// worker address and through the handshake of Connect and Accept.
func TestEndpointReach(t *testing.T) {
	local, err := protocol.LocalHostIdentity(nil)
	if err != nil {
		t.Skipf("no host identity here: %v", err)
	}
	devA := [16]byte{0xa}
	devB := [16]byte{0xb}
	cases := []struct {
		name       string
		a, b       [16]byte
		peerAccess func([16]byte) bool
		want       protocol.Reach
	}{
		{"same device", devA, devA, nil, protocol.ReachSameDevice},
		{"peer device", devA, devB, func(d [16]byte) bool { return d == devA || d == devB }, protocol.ReachPeerDevice},
		{"no peer access", devA, devB, nil, protocol.ReachNoPeerAccess},
		{"no device", devA, [16]byte{}, nil, protocol.ReachNone},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			// The handshake of Connect and Accept: both sides learn the other.
			p, l, err := listenPair(t, ContextParams{DeviceUUID: c.a}, ContextParams{DeviceUUID: c.b})
			require.NoError(t, err)
			require.NoError(t, l.Close())
			require.Equal(t, local.BootID, p.ctxA.HostIdentity().BootID)
			require.Equal(t, c.a, p.ctxA.HostIdentity().Device)
			require.Equal(t, c.want, p.epA.Reach(c.peerAccess))
			require.Equal(t, c.want, p.epB.Reach(c.peerAccess))

			// The sealed worker address.
			addr, err := p.b.Address()
			require.NoError(t, err)
			ep, err := p.a.ConnectAddress(addr, &EndpointParams{NoPeerErrorHandling: true})
			require.NoError(t, err)
			require.Equal(t, c.want, ep.Reach(c.peerAccess))
		})
	}
}
