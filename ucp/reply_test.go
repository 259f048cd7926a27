package ucp

import (
	"testing"
	"time"
	"unsafe"

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

// replyWorker is a worker of its own context over tcp, closed with the test.
func replyWorker(t *testing.T) (*Context, *Worker) {
	t.Helper()
	c, err := NewContext(ContextParams{Config: map[string]string{"TLS": "tcp"}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	w, err := c.NewWorker(WorkerParams{})
	require.NoError(t, err)
	return c, w
}

// replySender connects a to b twice and returns the second endpoint. b's own endpoint
// to a (the one it makes to answer) pairs with a's first (UCX matches the endpoints two
// workers make to each other), so b gets the second one's messages through an endpoint
// UCX made, and answers them through the sender's hello alone.
func replySender(t *testing.T, a, b *Worker) *Endpoint {
	t.Helper()
	addr, err := b.Address()
	require.NoError(t, err)
	_, err = a.ConnectAddress(addr, nil)
	require.NoError(t, err)
	ep, err := a.ConnectAddress(addr, nil)
	require.NoError(t, err)
	return ep
}

// answerPings makes b answer every message of id 1 on its reply endpoint with id 2; it
// returns whether each message had one.
func answerPings(t *testing.T, b *Worker) <-chan bool {
	t.Helper()
	had := make(chan bool, 16)
	require.NoError(t, b.SetAmHandler(1, func(m *AmMessage) {
		ep := m.ReplyEndpoint()
		if ep != nil {
			_, _ = ep.AmSendNbx(2, nil, append([]byte("re:"), m.Data()...), nil)
		}
		had <- ep != nil
	}))
	return had
}

// collectPongs gathers a's answers (id 2).
func collectPongs(t *testing.T, a *Worker) <-chan string {
	t.Helper()
	pongs := make(chan string, 16)
	require.NoError(t, a.SetAmHandler(2, func(m *AmMessage) { pongs <- string(m.Data()) }))
	return pongs
}

// ping sends msg on ep with AmReply and reports whether its receiver had a reply
// endpoint for it; if so, it waits for the answer and checks it.
func ping(t *testing.T, ep *Endpoint, b *Worker, had <-chan bool, pongs <-chan string, msg string) bool {
	t.Helper()
	_, err := ep.AmSendNbx(1, nil, []byte(msg), &RequestParam{AmFlags: AmReply})
	require.NoError(t, err)
	var ok bool
	progressAll(t, 10*time.Second, func() bool {
		select {
		case ok = <-had:
			return true
		default:
			return false
		}
	}, ep.w, b)
	if !ok {
		return false
	}
	var got string
	progressAll(t, 10*time.Second, func() bool {
		select {
		case got = <-pongs:
			return true
		default:
			return false
		}
	}, ep.w, b)
	require.Equal(t, "re:"+msg, got)
	return true
}

// senderOf is the UCX endpoint b knows ep's sender by: the one entry of b's reply
// senders that is not in before.
func senderOf(t *testing.T, b *Worker, before map[unsafe.Pointer]bool) unsafe.Pointer {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	var raw unsafe.Pointer
	for k := range b.replies {
		if !before[k] {
			require.Nil(t, raw, "one new sender")
			raw = k
		}
	}
	require.NotNil(t, raw, "the sender's hello was recorded")
	return raw
}

func replySenders(b *Worker) map[unsafe.Pointer]bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	m := map[unsafe.Pointer]bool{}
	for k := range b.replies {
		m[k] = true
	}
	return m
}

// flood hands b hellos of flooder's worker, each as if on an endpoint of its own (as
// a peer making endpoints without end would), until stop says so; b never remembers
// more than maxReplies senders. It returns the hellos handed.
func flood(t *testing.T, b *Worker, flooder *Endpoint, fakes []byte, stop func(n int) bool) int {
	t.Helper()
	hello := flooder.replyHelloMessage()
	require.NotNil(t, hello)
	b.mu.Lock()
	defer b.unlockDeferred()
	n := 0
	for ; !stop(n); n++ {
		require.Less(t, n, len(fakes), "the flood went on without end")
		require.True(t, b.replyHelloLocked(hello, unsafe.Pointer(&fakes[n])))
		require.LessOrEqual(t, len(b.replies), maxReplies, "reply senders past the bound")
	}
	return n
}

// replyFloodScene makes a receiver b answering pings (had, pongs) from a, whose
// endpoint epA to b sent a first ping (raw: its sender's entry at b), and a flooder's
// endpoint epF to b.
func replyFloodScene(t *testing.T) (a, b *Worker, epA, epF *Endpoint, had <-chan bool, pongs <-chan string, raw unsafe.Pointer) {
	_, a = replyWorker(t)
	_, b = replyWorker(t)
	_, f := replyWorker(t)
	had, pongs = answerPings(t, b), collectPongs(t, a)
	epA = replySender(t, a, b)
	before := replySenders(b)
	require.True(t, ping(t, epA, b, had, pongs, "first"))
	raw = senderOf(t, b, before)
	epF = replySender(t, f, b)
	return a, b, epA, epF, had, pongs, raw
}

// A sender the receiver forgot (past maxReplies senders, as a flood of them makes
// it) is answered again: the receiver tells it, and it sends its address again ahead
// of its next AmReply message. Before, its messages had no reply endpoint for good
// (nil, silently), since the address went once per endpoint.
func TestReplySenderForgottenIsAnsweredAgain(t *testing.T) {
	a, b, epA, epF, had, pongs, raw := replyFloodScene(t)
	fakes := make([]byte, 64*maxReplies)
	n := flood(t, b, epF, fakes, func(int) bool {
		_, kept := b.replies[raw]
		return !kept
	})
	require.GreaterOrEqual(t, n, maxReplies-1, "forgotten before the bound was reached")

	// A message sent before the sender heard of it has no reply endpoint (documented).
	require.False(t, ping(t, epA, b, had, pongs, "crossing"))
	// The receiver told the sender, which sends its address again.
	for deadline := time.Now().Add(10 * time.Second); epA.replyHello.Load(); {
		require.True(t, time.Now().Before(deadline), "the forgotten sender was never asked for its address again: its messages have no reply endpoint for good")
		a.Progress()
		b.Progress()
	}
	require.True(t, ping(t, epA, b, had, pongs, "after the flood"), "the forgotten sender is answered again")
	require.True(t, ping(t, epA, b, had, pongs, "and later"))
	b.mu.Lock()
	require.LessOrEqual(t, len(b.replies), maxReplies)
	b.mu.Unlock()
}

// The receiver forgets the senders least recently answered: one that keeps sending
// through a flood of senders is never forgotten (it needs no second hello).
func TestReplyFloodKeepsActiveSender(t *testing.T) {
	_, b, epA, epF, had, pongs, raw := replyFloodScene(t)
	fakes := make([]byte, 3*maxReplies)
	used := 0
	for round := 0; round < 6; round++ {
		chunk := fakes[used : used+maxReplies/2]
		used += flood(t, b, epF, chunk, func(n int) bool { return n == len(chunk) })
		b.mu.Lock()
		_, kept := b.replies[raw]
		b.mu.Unlock()
		require.True(t, kept, "round %d: the active sender was forgotten", round)
		require.True(t, ping(t, epA, b, had, pongs, "busy"), "round %d", round)
		require.True(t, epA.replyHello.Load(), "round %d: the sender was asked for its hello again", round)
	}
}

// Senders that are gone go first, without asking anyone for a hello: a sender older
// than the whole flood is kept while the flood finds such an entry to replace.
func TestReplyForgetsGoneSendersFirst(t *testing.T) {
	_, a := replyWorker(t)
	_, b := replyWorker(t)
	_, f := replyWorker(t)
	ctxG, g := replyWorker(t)
	had, pongs, pongsG := answerPings(t, b), collectPongs(t, a), collectPongs(t, g)
	epA := replySender(t, a, b)
	before := replySenders(b)
	require.True(t, ping(t, epA, b, had, pongs, "a"))
	rawA := senderOf(t, b, before)
	epG := replySender(t, g, b)
	before = replySenders(b)
	require.True(t, ping(t, epG, b, had, pongsG, "g"))
	rawG := senderOf(t, b, before)
	require.NoError(t, ctxG.Close()) // g goes away: b's endpoint to it fails
	progressAll(t, 10*time.Second, func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		rp := b.replies[rawG]
		return rp == nil || rp.ep != nil && rp.ep.err != nil
	}, b)

	epF := replySender(t, f, b)
	fakes := make([]byte, maxReplies)
	flood(t, b, epF, fakes, func(int) bool { return len(b.replies) == maxReplies })
	flood(t, b, epF, fakes[maxReplies-1:], func(n int) bool { return n == 1 })
	b.mu.Lock()
	_, keptG := b.replies[rawG]
	_, keptA := b.replies[rawA]
	b.mu.Unlock()
	require.False(t, keptG, "the gone sender is forgotten")
	require.True(t, keptA, "a live sender went while a gone one was left")
	require.True(t, ping(t, epA, b, had, pongs, "still"))
}
