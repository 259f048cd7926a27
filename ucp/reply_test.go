package ucp

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A reply endpoint kept past its sender's death fails calls with the peer's failure
// instead of using the endpoint UCX destroyed with the connection (it crashed the
// process inside UCX).
func TestReplyEndpointAfterSenderGoneFails(t *testing.T) {
	cfg := map[string]string{"TLS": "tcp"}
	ctxA, err := NewContext(ContextParams{Config: cfg})
	require.NoError(t, err)
	ctxB, err := NewContext(ContextParams{Config: cfg})
	require.NoError(t, err)
	defer ctxB.Close()
	a, err := ctxA.NewWorker(WorkerParams{})
	require.NoError(t, err)
	b, err := ctxB.NewWorker(WorkerParams{})
	require.NoError(t, err)
	addrB, err := b.Address()
	require.NoError(t, err)
	epA, err := a.ConnectAddress(addrB, nil) // b has no endpoint of its own to a
	require.NoError(t, err)
	eps := make(chan *Endpoint, 1)
	require.NoError(t, b.SetAmHandler(1, func(m *AmMessage) {
		ep := m.ReplyEndpoint()
		if ep != nil {
			_, _ = ep.AmSendNbx(2, nil, []byte("pong"), nil)
		}
		eps <- ep
	}))
	replies := make(chan string, 1)
	require.NoError(t, a.SetAmHandler(2, func(m *AmMessage) { replies <- string(m.Data()) }))
	_, err = epA.AmSendNbx(1, nil, []byte("ping"), &RequestParam{AmFlags: AmReply})
	require.NoError(t, err)
	var reply *Endpoint
	for deadline := time.Now().Add(10 * time.Second); reply == nil; {
		a.Progress()
		b.Progress()
		select {
		case reply = <-eps:
			require.NotNil(t, reply)
		default:
		}
		require.True(t, time.Now().Before(deadline))
	}
	for deadline := time.Now().Add(10 * time.Second); ; {
		a.Progress()
		b.Progress()
		select {
		case got := <-replies:
			require.Equal(t, "pong", got, "the reply reaches the sender")
		default:
			require.True(t, time.Now().Before(deadline))
			continue
		}
		break
	}
	require.NoError(t, ctxA.Close()) // the sender goes away
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); {
		b.Progress()
	}
	_, err = reply.AmSendNbx(2, nil, []byte("late"), nil)
	require.ErrorIs(t, err, ErrPeerFailed)
	_, err = reply.TagSendNbx([]byte("late"), 1, nil)
	require.ErrorIs(t, err, ErrPeerFailed)
	_, err = reply.FlushNbx(nil)
	require.Error(t, err)
	_ = reply.Close()
}
