package tests

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/prepare"
	"github.com/ucpx/ucpx/stream"
	"github.com/ucpx/ucpx/ucp"
)

const (
	psendParts    = 8
	psendPartSize = 4096
	psendHeld     = 5 // the partition the dying sender never makes ready
	psendTag      = 0x5e
	psendDied     = 3 // the sender's exit status when it died as planned
)

// runPartitionedSender is the peer process of TestPreparedPeerKilledMidIteration: it
// connects over tcp, prepares a partitioned send, runs one whole iteration, then
// makes every partition but one ready in the second and dies without closing anything.
func runPartitionedSender() error {
	uctx, w, err := peerWorker(contextConfig("tcp"))
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ep, err := w.Connect(ctx, os.Getenv(envListenAddr), nil)
	if err != nil {
		return err
	}
	buf := make([]byte, psendParts*psendPartSize)
	send, err := prepare.PsendInit(w, buf, prepare.Params{Peer: ep, Tag: psendTag, Partitions: psendParts})
	if err != nil {
		return err
	}
	if err := prepare.PrepareAll(ctx, send); err != nil {
		return err
	}
	for iter := 1; iter <= 2; iter++ {
		if err := send.Start(); err != nil {
			return err
		}
		for i := range buf {
			buf[i] = byte(iter + i)
		}
		for p := range psendParts {
			if iter == 2 && p == psendHeld {
				continue
			}
			if err := send.Pready(p); err != nil {
				return err
			}
		}
		if iter == 1 {
			if err := send.Wait(ctx); err != nil {
				return err
			}
			continue
		}
		// The ready partitions go out with no further call on the request (the
		// registry moves them once the receiver's readiness lands); then die
		// mid-iteration.
		deadline := time.Now().Add(10 * time.Second)
		for send.Stats().Puts < 2*psendParts-1 {
			if time.Now().After(deadline) {
				return fmt.Errorf("iteration 2: %d puts, want %d", send.Stats().Puts, 2*psendParts-1)
			}
			time.Sleep(time.Millisecond)
		}
		time.Sleep(50 * time.Millisecond)
		os.Exit(psendDied)
	}
	_ = uctx
	return nil
}

// A sender killed in the middle of an iteration: the receiver's Wait and Parrived
// complete with an error matching ucp.ErrPeerFailed, and a stream waiting for the
// missing partition is released (it does not hang on the dead peer).
func TestPreparedPeerKilledMidIteration(t *testing.T) {
	uctx, err := ucp.NewContext(ucp.ContextParams{Config: contextConfig("tcp")})
	require.NoError(t, err)
	defer uctx.Close()
	w, err := uctx.NewWorker(ucp.WorkerParams{})
	require.NoError(t, err)
	l, err := w.Listen("127.0.0.1:0", nil)
	require.NoError(t, err)
	out := &childOutput{}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envRole+"=psend", envListenAddr+"="+l.Addr())
	cmd.Stdout, cmd.Stderr = out, out
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		_ = cmd.Process.Kill()
	}()

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ep, err := l.Accept(ctx, nil)
	require.NoError(t, err, "peer output:\n%s", out)
	require.NoError(t, l.Close())

	b, err := stream.Open(stream.Host)
	require.NoError(t, err)
	defer b.Close()
	s, err := b.NewStream()
	require.NoError(t, err)
	defer s.Close()
	buf := make([]byte, psendParts*psendPartSize)
	recv, err := prepare.PrecvInit(w, buf, prepare.Params{Peer: ep, Tag: psendTag, Partitions: psendParts, Backend: b})
	require.NoError(t, err)
	require.NoError(t, prepare.PrepareAll(ctx, recv), "peer output:\n%s", out)

	require.NoError(t, recv.Start())
	require.NoError(t, recv.Wait(ctx), "peer output:\n%s", out)
	for i := range buf {
		require.Equal(t, byte(1+i), buf[i], "iteration 1, byte %d", i)
	}

	require.NoError(t, recv.Start())
	require.NoError(t, recv.ArrivedOnStream(s, psendHeld))
	released := make(chan error, 1)
	go func() { released <- s.Synchronize() }()

	err = recv.Wait(ctx)
	require.ErrorIs(t, err, ucp.ErrPeerFailed, "peer output:\n%s", out)
	var exit *exec.ExitError
	require.ErrorAs(t, <-exited, &exit, "peer output:\n%s", out)
	require.Equal(t, psendDied, exit.ExitCode(), "the peer died as planned, after its ready partitions went out; output:\n%s", out)
	select {
	case err := <-released:
		require.NoError(t, err, "the stream is released, not failed: Wait and Parrived report the failure")
	case <-time.After(10 * time.Second):
		t.Fatal("the stream waiting for the missing partition stayed blocked on the dead peer")
	}
	_, err = recv.Parrived(psendHeld)
	require.ErrorIs(t, err, ucp.ErrPeerFailed)
	require.ErrorIs(t, recv.Start(), ucp.ErrPeerFailed, "no new iteration with a dead peer")
	require.NoError(t, recv.Free())
}
