package ucp

import (
	"context"
	"testing"
	"time"

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
		{"peer device", devA, devB, func(d [16]byte) bool { return d == devB }, protocol.ReachPeerDevice},
		{"no peer access", devA, devB, nil, protocol.ReachNoPeerAccess},
		{"no device", devA, [16]byte{}, nil, protocol.ReachNone},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctxA, err := NewContext(ContextParams{DeviceUUID: c.a})
			require.NoError(t, err)
			defer ctxA.Close()
			ctxB, err := NewContext(ContextParams{DeviceUUID: c.b})
			require.NoError(t, err)
			defer ctxB.Close()
			require.Equal(t, local.BootID, ctxA.HostIdentity().BootID)
			require.Equal(t, c.a, ctxA.HostIdentity().Device)
			wa, err := ctxA.NewWorker(WorkerParams{})
			require.NoError(t, err)
			defer wa.Close()
			wb, err := ctxB.NewWorker(WorkerParams{})
			require.NoError(t, err)
			defer wb.Close()

			// Sealed worker address.
			addr, err := wb.Address()
			require.NoError(t, err)
			ep, err := wa.ConnectAddress(addr, &EndpointParams{NoPeerErrorHandling: true})
			require.NoError(t, err)
			require.Equal(t, c.want, ep.Reach(c.peerAccess))
			require.NoError(t, ep.closeWith(false, time.Second))

			// Handshake: both sides learn the other.
			l, err := wb.Listen("127.0.0.1:0", nil)
			require.NoError(t, err)
			defer l.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			accepted := make(chan *Endpoint, 1)
			go func() {
				ep, err := l.Accept(ctx, nil)
				if err != nil {
					accepted <- nil
					return
				}
				accepted <- ep
				for ctx.Err() == nil && len(accepted) > 0 {
					wb.Progress()
				}
			}()
			client, err := wa.Connect(ctx, l.Addr(), nil)
			require.NoError(t, err)
			server := <-accepted
			require.NotNil(t, server)
			require.Equal(t, c.want, client.Reach(c.peerAccess))
			back := c.want
			if c.want == protocol.ReachPeerDevice {
				back = protocol.ReachPeerDevice // the same access function, asked for devA
				require.Equal(t, back, server.Reach(func(d [16]byte) bool { return d == devA }))
			} else {
				require.Equal(t, back, server.Reach(c.peerAccess))
			}
			cancel()
		})
	}
}
