package ucp

import (
	"context"
	"runtime"

	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/condition"
)

// chainPingPong builds the two chains of a ping-pong of size bytes on p: the
// initiator's [send tag 1] [receive tag 2] on a, the responder's [receive tag 1]
// [send tag 2] on b, which sends back what it received.
func chainPingPong(t testing.TB, p *pair, out, in, echo []byte, n uint64) (ini, resp *condition.Chain) {
	var err error
	ini, err = condition.NewChain(condition.ChainParam{Repeat: n})
	require.NoError(t, err)
	resp, err = condition.NewChain(condition.ChainParam{Repeat: n})
	require.NoError(t, err)
	_, err = p.epA.TagSendNbx(out, 1, &RequestParam{Chain: ini})
	require.NoError(t, err)
	require.NoError(t, ini.Then())
	_, err = p.a.TagRecvNbx(in, 2, ^uint64(0), &RequestParam{Chain: ini})
	require.NoError(t, err)
	_, err = p.b.TagRecvNbx(echo, 1, ^uint64(0), &RequestParam{Chain: resp})
	require.NoError(t, err)
	require.NoError(t, resp.Then())
	_, err = p.epB.TagSendNbx(echo, 2, &RequestParam{Chain: resp})
	require.NoError(t, err)
	return ini, resp
}

// runChains starts every chain and waits for them, each on its own goroutine.
func runChains(ctx context.Context, chains ...*condition.Chain) []error {
	errs := make([]error, len(chains))
	done := make(chan int, len(chains))
	for i, c := range chains {
		if err := c.Start(); err != nil {
			errs[i] = err
			done <- i
			continue
		}
		go func(i int, c *condition.Chain) {
			errs[i] = c.Wait(ctx)
			done <- i
		}(i, c)
	}
	for range chains {
		<-done
	}
	return errs
}

func TestChainPingPong(t *testing.T) {
	pairs(t, func(t *testing.T, p *pair) {
		for _, size := range []int{8, 64 << 10} { // eager and rendezvous
			out, in, echo := pattern(size, int64(size)), make([]byte, size), make([]byte, size)
			const n = 500
			ini, resp := chainPingPong(t, p, out, in, echo, n)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			errs := runChains(ctx, resp, ini)
			cancel()
			require.NoError(t, errs[0])
			require.NoError(t, errs[1])
			assert.Equal(t, uint64(n), ini.Iterations())
			assert.Equal(t, uint64(n), resp.Iterations())
			assert.Equal(t, checksum(out), checksum(in), "size %d: the reply is what was sent", size)
			assert.Equal(t, checksum(out), checksum(echo))
			assert.Len(t, ini.IterationTimes(), n-1)
			// A chain runs again.
			clear(in)
			errs = runChains(context.Background(), resp, ini)
			require.NoError(t, errs[0])
			require.NoError(t, errs[1])
			assert.Equal(t, checksum(out), checksum(in))
			require.NoError(t, ini.Destroy())
			require.NoError(t, resp.Destroy())
		}
	})
}

// A ring of three workers: member 0 sends its payload to member 1, each member
// forwards what it receives to the next, and member 0 receives it back: per iteration
// the payload goes round once, every hop posted from the completion of the receive.
func TestChainRing(t *testing.T) {
	const members, n, size = 3, 300, 256
	uctx, err := NewContext(ContextParams{})
	require.NoError(t, err)
	defer uctx.Close()
	ws := make([]*Worker, members)
	addrs := make([][]byte, members)
	for i := range ws {
		ws[i], err = uctx.NewWorker(WorkerParams{})
		require.NoError(t, err)
		addrs[i], err = ws[i].Address()
		require.NoError(t, err)
	}
	bufs := make([][]byte, members)
	chains := make([]*condition.Chain, members)
	payload := pattern(size, 7)
	for i := range ws {
		next, err := ws[i].ConnectAddress(addrs[(i+1)%members], &EndpointParams{NoPeerErrorHandling: true})
		require.NoError(t, err)
		bufs[i] = make([]byte, size)
		chains[i], err = condition.NewChain(condition.ChainParam{Repeat: n})
		require.NoError(t, err)
		c := chains[i]
		sendTag, recvTag := uint64(100+(i+1)%members), uint64(100+i)
		recv := func() {
			_, err := ws[i].TagRecvNbx(bufs[i], recvTag, ^uint64(0), &RequestParam{Chain: c})
			require.NoError(t, err)
		}
		send := func() {
			_, err := next.TagSendNbx(bufs[i], sendTag, &RequestParam{Chain: c})
			require.NoError(t, err)
		}
		if i == 0 {
			copy(bufs[0], payload)
			send()
			require.NoError(t, c.Then())
			recv()
		} else {
			recv()
			require.NoError(t, c.Then())
			send()
		}
		require.Equal(t, 2, c.Steps())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	errs := runChains(ctx, chains[2], chains[1], chains[0])
	for i, err := range errs {
		require.NoError(t, err, "member %d", 2-i)
	}
	for i := range ws {
		assert.Equal(t, uint64(n), chains[i].Iterations(), "member %d", i)
		assert.Equal(t, checksum(payload), checksum(bufs[i]), "member %d forwarded the payload", i)
		require.NoError(t, chains[i].Destroy())
	}
	for _, w := range ws {
		require.NoError(t, w.Close())
	}
}

func TestChainErrors(t *testing.T) {
	p := newShmPair(t)
	c, err := condition.NewChain(condition.ChainParam{})
	require.NoError(t, err)
	// Nothing enqueued.
	require.ErrorIs(t, c.Start(), ErrInvalidParam)
	require.ErrorIs(t, c.Then(), ErrInvalidParam)
	// Chains hold tag operations only, without callbacks, conditions or owned requests.
	_, err = p.epA.PutNbx(make([]byte, 8), 0, nil, &RequestParam{Chain: c})
	require.ErrorIs(t, err, ErrUnsupported)
	_, err = p.epA.TagSendNbx(make([]byte, 8), 1, &RequestParam{Chain: c, Callback: func(*Request) {}})
	require.ErrorIs(t, err, ErrInvalidParam)
	_, err = p.epA.TagSendNbx(make([]byte, 8), 1, &RequestParam{Chain: c, Request: new(Request)})
	require.ErrorIs(t, err, ErrInvalidParam)
	// One worker per chain.
	_, err = p.epA.TagSendNbx(make([]byte, 8), 1, &RequestParam{Chain: c})
	require.NoError(t, err)
	_, err = p.b.TagRecvNbx(make([]byte, 8), 1, ^uint64(0), &RequestParam{Chain: c})
	require.ErrorIs(t, err, ErrInvalidParam)
	require.ErrorIs(t, c.Wait(nil), ErrInvalidParam) //nolint:staticcheck
	require.NoError(t, c.Destroy())
	require.ErrorIs(t, c.Destroy(), condition.ErrDestroyed)
	require.ErrorIs(t, c.Start(), ErrClosed)

	// A truncating receive stops the chain with its error; ctx ends a wait on a
	// receive that never matches, and Destroy cancels it.
	small, err := condition.NewChain(condition.ChainParam{Repeat: 10})
	require.NoError(t, err)
	_, err = p.b.TagRecvNbx(make([]byte, 4), 5, ^uint64(0), &RequestParam{Chain: small})
	require.NoError(t, err)
	require.NoError(t, small.Start())
	require.ErrorIs(t, small.Start(), ErrBusy)
	s, err := p.epA.TagSendNbx(make([]byte, 64), 5, nil)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- s.Wait(ctx) }()
	require.ErrorIs(t, small.Wait(ctx), ErrMessageTruncated)
	require.NoError(t, <-done)
	assert.Equal(t, uint64(0), small.Iterations())
	require.NoError(t, small.Destroy())

	never, err := condition.NewChain(condition.ChainParam{})
	require.NoError(t, err)
	_, err = p.b.TagRecvNbx(make([]byte, 8), 99, ^uint64(0), &RequestParam{Chain: never})
	require.NoError(t, err)
	require.NoError(t, never.Start())
	require.ErrorIs(t, never.Then(), ErrBusy, "a step added to a running chain")
	short, cancelShort := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancelShort()
	require.ErrorIs(t, never.Wait(short), context.DeadlineExceeded)
	waited := make(chan error, 1)
	go func() { waited <- never.Wait(ctx) }()
	time.Sleep(10 * time.Millisecond)
	require.NoError(t, never.Destroy()) // cancels the receive
	// A Wait under way says what a Wait after Destroy says.
	require.ErrorIs(t, <-waited, condition.ErrDestroyed)
	require.ErrorIs(t, never.Wait(ctx), condition.ErrDestroyed)
}

// A chain left running when its worker closes: Close cancels it, and Wait and
// Destroy afterwards report the closed worker without touching UCX.
func TestChainWorkerClose(t *testing.T) {
	uctx, err := NewContext(ContextParams{})
	require.NoError(t, err)
	defer uctx.Close()
	w, err := uctx.NewWorker(WorkerParams{})
	require.NoError(t, err)
	c, err := condition.NewChain(condition.ChainParam{})
	require.NoError(t, err)
	_, err = w.TagRecvNbx(make([]byte, 8), 1, ^uint64(0), &RequestParam{Chain: c})
	require.NoError(t, err)
	require.NoError(t, c.Start())
	require.NoError(t, w.Close())
	require.ErrorIs(t, c.Wait(context.Background()), ErrClosed)
	require.NoError(t, c.Destroy())
}

func TestChainParkedWaiterWokenByOtherProgress(t *testing.T) {
	// A waiter parked on the event fd while another goroutine's progress ends the run
	// is woken by the chain's end (it signals the worker).
	p := shmPairWith(t, WorkerParams{SpinTime: -1})
	c, err := condition.NewChain(condition.ChainParam{})
	require.NoError(t, err)
	buf := make([]byte, 8)
	_, err = p.b.TagRecvNbx(buf, 3, ^uint64(0), &RequestParam{Chain: c})
	require.NoError(t, err)
	require.NoError(t, c.Start())
	done := make(chan error, 1)
	go func() { done <- c.Wait(context.Background()) }()
	time.Sleep(20 * time.Millisecond) // let it park
	_, err = p.epA.TagSendNbx([]byte("8 bytes!"), 3, nil)
	require.NoError(t, err)
	stop := background(p.b) // another goroutine progresses b and completes the receive
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(20 * time.Second):
		t.Fatal("parked chain waiter not woken")
	}
	stop()
	p.a.Progress()
	assert.Equal(t, "8 bytes!", string(buf))
	require.NoError(t, c.Destroy())

}

// The engine's goroutine alone issues conditioned operations after it went to sleep: a
// host stream's trigger store kicks it awake from the worker's event fd, and a
// KernelTriggered trigger stored on the host (which kicks nobody) is still found, as the
// engine polls while such a condition is pending. Nothing here drives the engine: the
// test only reads Done.
func TestEngineWakesFromItsSleep(t *testing.T) {
	p := newShmPair(t)
	stop := background(p.b)
	defer stop()
	b := hostBackend(t)
	s, c := streamCondition(t, b)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// Start the engine and let it go to sleep.
	rr, err := p.b.TagRecvNbx(make([]byte, 8), 1, ^uint64(0), nil)
	require.NoError(t, err)
	sr, err := p.epA.TagSendNbx([]byte("start..."), 1, &RequestParam{Condition: c})
	require.NoError(t, err)
	require.NoError(t, sr.Wait(ctx))
	require.NoError(t, rr.Wait(ctx))
	waitEngineAsleep(t)
	doneAlone := func(r *Request) {
		t.Helper()
		for !r.Done() {
			require.NoError(t, ctx.Err(), "the engine did not issue the operation")
			time.Sleep(time.Millisecond)
		}
		require.NoError(t, r.Err())
	}

	in := make([]byte, 8)
	rr, err = p.b.TagRecvNbx(in, 2, ^uint64(0), nil)
	require.NoError(t, err)
	sr, err = p.epA.TagSendNbx([]byte("stream.."), 2, &RequestParam{Condition: c, Flags: NonBlockingEnqueue})
	require.NoError(t, err)
	doneAlone(sr)
	doneAlone(rr)
	assert.Equal(t, "stream..", string(in))
	require.NoError(t, s.Synchronize())

	kc, err := condition.Create(condition.Param{Category: condition.KernelTriggered, Backend: b})
	require.NoError(t, err)
	defer func() { require.NoError(t, kc.Destroy()) }()
	rr, err = p.b.TagRecvNbx(in, 3, ^uint64(0), nil)
	require.NoError(t, err)
	sr, err = p.epA.TagSendNbx([]byte("kernel.."), 3, &RequestParam{Condition: kc})
	require.NoError(t, err)
	h, err := kc.DeviceHandle()
	require.NoError(t, err)
	waitEngineAsleep(t)
	require.NoError(t, condition.Trigger(h))
	doneAlone(sr)
	doneAlone(rr)
	assert.Equal(t, "kernel..", string(in))
}

// waitEngineAsleep waits until the engine's goroutine blocks (on its wake channel, a
// timer, or the worker's event fd).
func waitEngineAsleep(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		buf := make([]byte, 1<<20)
		if containsParkedProxy(string(buf[:runtime.Stack(buf, true)])) {
			return
		}
		require.True(t, time.Now().Before(deadline), "the engine never went to sleep")
		time.Sleep(time.Millisecond)
	}
}

// A chain forwarding what it receives on an endpoint that closes while the run waits
// for the receive: the receive still gets its message, and the send after it is not
// posted on the closed endpoint (UCX forbids it) but fails with ErrClosed, which stops
// the run (ErrCanceled); a later Start is refused with ErrClosed.
func TestChainEndpointClosedMidRun(t *testing.T) {
	p := newShmPair(t)
	c, err := condition.NewChain(condition.ChainParam{Repeat: 2})
	require.NoError(t, err)
	defer func() { require.NoError(t, c.Destroy()) }()
	buf := make([]byte, 8)
	_, err = p.b.TagRecvNbx(buf, 7, ^uint64(0), &RequestParam{Chain: c})
	require.NoError(t, err)
	require.NoError(t, c.Then())
	_, err = p.epB.TagSendNbx(buf, 8, &RequestParam{Chain: c})
	require.NoError(t, err)
	require.NoError(t, c.Start())
	require.NoError(t, p.epB.Close())
	s, err := p.epA.TagSendNbx([]byte("8 bytes!"), 7, nil)
	require.NoError(t, err)
	waitAll(t, 20*time.Second, s)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	require.ErrorIs(t, c.Wait(ctx), ErrCanceled)
	assert.Equal(t, uint64(0), c.Iterations())
	require.NoError(t, c.OpErr(0), "the receive got its message")
	assert.Equal(t, []byte("8 bytes!"), buf)
	require.ErrorIs(t, c.OpErr(1), ErrClosed, "the send on the closed endpoint")
	require.ErrorIs(t, c.Start(), ErrClosed)
}
