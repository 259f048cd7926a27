package ucp

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// A receiver's ctlReplyHello resets only the endpoint its token names, and only one
// to the peer that sent it.
func TestReplyHelloAgainNamesOneEndpoint(t *testing.T) {
	_, a := replyWorker(t)
	cb, b := replyWorker(t)
	addr, err := b.Address()
	require.NoError(t, err)
	ep1, err := a.ConnectAddress(addr, nil)
	require.NoError(t, err)
	ep2, err := a.ConnectAddress(addr, nil)
	require.NoError(t, err)
	for _, ep := range []*Endpoint{ep1, ep2} {
		ep.replyHello.Store(true)
	}
	a.mu.Lock()
	a.helloAgainLocked([idLen]byte{9}, replyToken(ep2)) // not b
	require.True(t, ep2.replyHello.Load())
	a.helloAgainLocked(cb.trust.id, replyToken(ep2))
	a.mu.Unlock()
	require.True(t, ep1.replyHello.Load())
	require.False(t, ep2.replyHello.Load())
	require.NotEqual(t, replyToken(ep1), replyToken(ep2))
}
