package tests

import (
	"context"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/condition"
	"github.com/ucpx/ucpx/graph"
	"github.com/ucpx/ucpx/stream"
	"github.com/ucpx/ucpx/ucp"
)

// The trust peer is this test binary re-executed with envTrustRole set (before
// TestMain, from init): it connects to the parent over shared memory, sends its worker
// address, then waits to be killed.
const (
	envTrustRole   = "UCPX_TRUST_ROLE"
	envTrustParent = "UCPX_TRUST_PARENT"
	tagTrustHello  = 9 << 40
	tagTrustKey    = 10 << 40 // the sleeper's packed key of a region it registered
)

func init() {
	if os.Getenv(envTrustRole) == "sleeper" {
		if err := trustSleeper(); err != nil {
			fmt.Fprintln(os.Stderr, "trust peer:", err)
			os.Exit(2)
		}
		os.Exit(0)
	}
}

func trustSleeper() error {
	uctx, err := ucp.NewContext(ucp.ContextParams{})
	if err != nil {
		return err
	}
	w, err := uctx.NewWorker(ucp.WorkerParams{})
	if err != nil {
		return err
	}
	parent, err := hex.DecodeString(os.Getenv(envTrustParent))
	if err != nil {
		return err
	}
	ep, err := w.ConnectAddress(parent, &ucp.EndpointParams{NoPeerErrorHandling: true})
	if err != nil {
		return err
	}
	self, err := w.Address()
	if err != nil {
		return err
	}
	r, err := ep.TagSendNbx(self, tagTrustHello, nil)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := r.Wait(ctx); err != nil {
		return err
	}
	region, err := uctx.MemAlloc(1 << 20)
	if err != nil {
		return err
	}
	packed, err := region.PackRkey()
	if err != nil {
		return err
	}
	if r, err = ep.TagSendNbx(packed, tagTrustKey, nil); err != nil {
		return err
	}
	if err := r.Wait(ctx); err != nil {
		return err
	}
	for ctx.Err() == nil { // until killed
		w.Progress()
		time.Sleep(time.Millisecond)
	}
	return nil
}

// spawnSleeper starts a peer process connected over shared memory (no peer error
// handling: UCX notices nothing when it dies) and returns this side's worker, the
// endpoint to the peer and the peer's command (killed when the test ends).
func spawnSleeper(t *testing.T) (*ucp.Worker, *ucp.Endpoint, *exec.Cmd) {
	t.Helper()
	uctx, err := ucp.NewContext(ucp.ContextParams{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = uctx.Close() })
	w, err := uctx.NewWorker(ucp.WorkerParams{})
	require.NoError(t, err)
	self, err := w.Address()
	require.NoError(t, err)
	exe, err := os.Executable()
	require.NoError(t, err)
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), envTrustRole+"=sleeper", envTrustParent+"="+hex.EncodeToString(self))
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	buf := make([]byte, 4096)
	r, err := w.TagRecvNbx(buf, tagTrustHello, ^uint64(0), nil)
	require.NoError(t, err)
	require.NoError(t, r.Wait(ctx))
	ep, err := w.ConnectAddress(buf[:r.Length()], &ucp.EndpointParams{NoPeerErrorHandling: true})
	require.NoError(t, err)
	return w, ep, cmd
}

// The key of a same-host peer that has exited is refused with a peer-failure error:
// UCX 1.13 would try to attach the peer's gone shared-memory segment and crash in the
// error path of ucp_ep_rkey_unpack.
func TestTrustKeyOfExitedPeerIsRefused(t *testing.T) {
	w, ep, cmd := spawnSleeper(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	packed := make([]byte, 4096)
	r, err := w.TagRecvNbx(packed, tagTrustKey, ^uint64(0), nil)
	require.NoError(t, err)
	require.NoError(t, r.Wait(ctx))
	packed = packed[:r.Length()]
	require.NoError(t, cmd.Process.Kill())
	_, _ = cmd.Process.Wait()
	_, err = ep.UnpackRkey(packed)
	require.ErrorIs(t, err, ucp.ErrPeerFailed)
}

// A peer killed over shared memory (where UCX notices nothing) while stream-ordered
// receives from it and sends to it are pending: the pidfd watch fails them and every
// stream is released.
func TestTrustPeerKilledOverShmReleasesStreams(t *testing.T) {
	w, ep, cmd := spawnSleeper(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	b := stream.NewHostBackend()
	defer b.Close()
	var streams []stream.Stream
	var reqs []*ucp.Request
	for i := 0; i < 4; i++ {
		s, err := b.NewStream()
		require.NoError(t, err)
		c, err := condition.Create(condition.Param{Category: condition.Stream, Backend: b, Stream: s})
		require.NoError(t, err)
		defer c.Destroy()
		for k := 0; k < 3; k++ {
			rr, err := w.TagRecvNbx(make([]byte, 64), uint64(100+i*10+k), ^uint64(0), &ucp.RequestParam{Condition: c, Peer: ep})
			require.NoError(t, err)
			reqs = append(reqs, rr)
		}
		streams = append(streams, s)
	}
	// Sends the peer never receives (rendezvous: pending until it does), stream-ordered.
	for i := 0; i < 2; i++ {
		s, err := b.NewStream()
		require.NoError(t, err)
		c, err := condition.Create(condition.Param{Category: condition.Stream, Backend: b, Stream: s})
		require.NoError(t, err)
		defer c.Destroy()
		sr, err := ep.TagSendNbx(make([]byte, 4<<20), uint64(200+i), &ucp.RequestParam{Condition: c})
		require.NoError(t, err)
		reqs = append(reqs, sr)
		streams = append(streams, s)
	}
	time.Sleep(50 * time.Millisecond) // the operations are issued and waiting
	killed := time.Now()
	require.NoError(t, cmd.Process.Kill())
	released := make(chan time.Duration, len(streams))
	for _, s := range streams {
		go func() { _ = s.Synchronize(); released <- time.Since(killed) }()
	}
	var worst time.Duration
	for range streams {
		select {
		case d := <-released:
			worst = max(worst, d)
		case <-ctx.Done():
			t.Fatal("a stream stayed blocked after its peer died")
		}
	}
	t.Logf("every stream released %v after the peer was killed (pidfd watch)", worst)
	require.Less(t, worst, 100*time.Millisecond, "the issue's bound")
	for _, rr := range reqs {
		require.True(t, rr.Done())
		require.ErrorIs(t, rr.Err(), ucp.ErrPeerFailed)
	}
	require.ErrorIs(t, ep.Err(), ucp.ErrPeerFailed)
}

// A panicking host-graph task fails the launch with an error carrying the panic value;
// the process survives and the graph launches again.
func TestTrustPanickingHostTask(t *testing.T) {
	g := graph.NewHost()
	var calls atomic.Int32
	_, err := g.AddTask(nil, func() error {
		if calls.Add(1) == 1 {
			panic("task boom")
		}
		return nil
	})
	require.NoError(t, err)
	x, err := g.Instantiate()
	require.NoError(t, err)
	b := stream.NewHostBackend()
	defer b.Close()
	s, err := b.NewStream()
	require.NoError(t, err)
	require.NoError(t, x.Launch(s))
	err = s.Synchronize()
	require.ErrorIs(t, err, graph.ErrTaskPanicked)
	require.Contains(t, err.Error(), "task boom")
	s2, err := b.NewStream()
	require.NoError(t, err)
	require.NoError(t, x.Launch(s2))
	require.NoError(t, s2.Synchronize())
	require.Equal(t, int32(2), calls.Load())
}
