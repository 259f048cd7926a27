package tests

import (
	"context"
	"hash/crc32"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/condition"
	"github.com/ucpx/ucpx/stream"
	"github.com/ucpx/ucpx/ucp"
)

// Every operation kind under a Stream condition and a KernelTriggered condition, against
// a peer process, data verified.
func TestConditionsBetweenTwoProcesses(t *testing.T) {
	for _, transport := range []string{"tcp", "shm"} {
		t.Run(transport, func(t *testing.T) {
			p := spawnPeer(t, transport)
			backend := stream.NewHostBackend()
			defer backend.Close()
			s, err := backend.NewStream()
			require.NoError(t, err)
			defer s.Close()
			sc, err := condition.Create(condition.Param{Category: condition.Stream, Backend: backend, Stream: s})
			require.NoError(t, err)
			kc, err := condition.Create(condition.Param{Category: condition.KernelTriggered, Backend: backend})
			require.NoError(t, err)
			replies := make(chan []byte, 1)
			require.NoError(t, p.w.SetAmHandler(amReply, func(m *ucp.AmMessage) {
				data := make([]byte, m.Length())
				r, err := m.RecvData(data, nil)
				if err != nil {
					replies <- nil
					return
				}
				go func() {
					ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
					defer cancel()
					if r.Wait(ctx) != nil {
						data = nil
					}
					replies <- data
				}()
			}))

			for round, cond := range []*condition.Condition{sc, kc} {
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				prm := &ucp.RequestParam{Condition: cond, Peer: p.ep}
				var reqs []*ucp.Request
				add := func(r *ucp.Request, err error) *ucp.Request {
					t.Helper()
					require.NoError(t, err)
					reqs = append(reqs, r)
					return r
				}
				// Tag echo of an eager and a rendezvous message.
				var ins, outs [][]byte
				for i, n := range []int{100, 2 << 20} {
					out := pattern(n, byte(10*round+i))
					in := make([]byte, n)
					tag := uint64(5000 + 10*round + i)
					// Send first: on a stream, operations complete in stream order, so a
					// receive before its own request would wait forever (as blocking MPI would).
					add(p.ep.TagSendNbx(out, tag, prm))
					add(p.w.TagRecvNbx(in, tag|tagReply, ^uint64(0), prm))
					ins, outs = append(ins, in), append(outs, out)
				}
				// AM echo.
				amData := pattern(300, byte(round))
				add(p.ep.AmSendNbx(amEcho, []byte("c"), amData, prm))
				// RMA into the peer's region, then an atomic, then flushes, then a get.
				region := pattern(64<<10, byte(round+3))
				add(p.ep.PutNbx(region, p.rkey.Base(), p.rkey, prm))
				add(p.ep.FlushNbx(prm))
				back := make([]byte, len(region))
				add(p.ep.GetNbx(back, p.rkey.Base(), p.rkey, prm))
				at := add(p.ep.AtomicNbx(ucp.AtomicParam{Op: ucp.AtomicSwap, Operand: 77}, p.rkey.Base()+65536, p.rkey, prm))
				add(p.w.FlushNbx(prm))

				if cond.Category() == condition.KernelTriggered {
					time.Sleep(10 * time.Millisecond)
					for _, r := range reqs {
						require.False(t, r.Done(), "kernel-triggered operation ran before its trigger")
					}
					h, err := cond.DeviceHandle()
					require.NoError(t, err)
					require.NoError(t, condition.Trigger(h))
				}
				for _, r := range reqs {
					require.NoError(t, r.Wait(ctx), "%v\npeer output:\n%s", cond.Category(), p.out)
				}
				for i := range ins {
					require.Equal(t, crc32.ChecksumIEEE(outs[i]), crc32.ChecksumIEEE(ins[i]), "%v: tag echo %d differs", cond.Category(), i)
				}
				require.Equal(t, crc32.ChecksumIEEE(region), crc32.ChecksumIEEE(back), "%v: get after put differs", cond.Category())
				if round == 1 {
					require.Equal(t, uint64(77), at.Fetched(), "second swap: it fetches the first swap's value")
				}
				var got []byte
				for got == nil {
					select {
					case got = <-replies:
					case <-ctx.Done():
						require.FailNowf(t, "no AM echo", "%v: no AM echo", cond.Category())
					default:
						p.w.Progress() // the echo arrives through this worker's AM handler
					}
				}
				require.Equal(t, crc32.ChecksumIEEE(amData), crc32.ChecksumIEEE(got), "%v: AM echo differs", cond.Category())
				require.NoError(t, s.Synchronize())
				require.NoError(t, cond.Err())
				cancel()
			}
			require.NoError(t, sc.Destroy())
			require.NoError(t, kc.Destroy())
		})
	}
}

// A peer that dies while a stream waits on one of its receives releases the stream:
// the operation completes with the peer's error on the Request and in the condition.
func TestDeadPeerReleasesStream(t *testing.T) {
	p := spawnPeer(t, "tcp")
	backend := stream.NewHostBackend()
	defer backend.Close()
	s, err := backend.NewStream()
	require.NoError(t, err)
	defer s.Close()
	c, err := condition.Create(condition.Param{Category: condition.Stream, Backend: backend, Stream: s})
	require.NoError(t, err)
	defer c.Destroy()

	rr, err := p.w.TagRecvNbx(make([]byte, 64), 0xdead, ^uint64(0), &ucp.RequestParam{Condition: c, Peer: p.ep})
	require.NoError(t, err)
	released := make(chan struct{})
	require.NoError(t, s.LaunchHostFunc(func() { close(released) }))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, send(ctx, p.ep, nil, tagDie))
	start := time.Now()
	select {
	case <-released:
	case <-ctx.Done():
		require.FailNow(t, "stream still blocked 30 s after the peer died")
	}
	t.Logf("stream released %v after the peer was told to die", time.Since(start))
	require.ErrorIs(t, rr.Wait(ctx), ucp.ErrPeerFailed, "request")
	require.ErrorIs(t, c.Err(), ucp.ErrPeerFailed, "condition")
	require.NoError(t, s.Synchronize())
	_ = p.exit()
}
