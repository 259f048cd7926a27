package tests

import (
	"context"
	"hash/crc32"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/condition"
	"github.com/ucpx/ucpx/protocol"
	"github.com/ucpx/ucpx/stream"
	"github.com/ucpx/ucpx/ucp"
)

// stagingPair is two workers of one context over shared memory, the context
// configured with cfg.
type stagingPair struct {
	ctx    *ucp.Context
	a, b   *ucp.Worker
	ab, ba *ucp.Endpoint
}

func newStagingPair(t *testing.T, cfg protocol.Config) *stagingPair {
	t.Helper()
	uctx, err := ucp.NewContext(ucp.ContextParams{Protocol: cfg, Config: map[string]string{"TLS": "shm,self"}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = uctx.Close() })
	p := &stagingPair{ctx: uctx}
	p.a, err = uctx.NewWorker(ucp.WorkerParams{})
	require.NoError(t, err)
	p.b, err = uctx.NewWorker(ucp.WorkerParams{})
	require.NoError(t, err)
	aa, err := p.a.Address()
	require.NoError(t, err)
	ba, err := p.b.Address()
	require.NoError(t, err)
	p.ab, err = p.a.ConnectAddress(ba, &ucp.EndpointParams{NoPeerErrorHandling: true})
	require.NoError(t, err)
	p.ba, err = p.b.ConnectAddress(aa, &ucp.EndpointParams{NoPeerErrorHandling: true})
	require.NoError(t, err)
	return p
}

// waitReqs drives both workers until every request is done, and requires success.
func (p *stagingPair) waitReqs(t *testing.T, reqs ...*ucp.Request) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for _, r := range reqs {
		for done, _ := r.Test(); !done; done, _ = r.Test() {
			p.a.Progress()
			p.b.Progress()
			require.True(t, time.Now().Before(deadline), "operation did not complete")
		}
		require.NoError(t, r.Err())
	}
}

// remoteRegion registers n bytes of b's context and unpacks their rkey on a's endpoint,
// both closed when the test ends.
func (p *stagingPair) remoteRegion(t *testing.T, n int) (*ucp.MemH, *ucp.Rkey) {
	t.Helper()
	remote, err := p.ctx.MemAlloc(n)
	require.NoError(t, err)
	t.Cleanup(func() { _ = remote.Close() })
	packed, err := remote.PackRkey()
	require.NoError(t, err)
	rkey, err := p.ab.UnpackRkey(packed)
	require.NoError(t, err)
	t.Cleanup(func() { _ = rkey.Close() })
	return remote, rkey
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rand.Uint32())
	}
	return b
}

// stagingCase moves tag messages, AM messages and RMA of several sizes from a to b
// with param (which says the condition, if any, of each side), checksumming each.
// sync waits for the streams, if any: staged data reaches a receive buffer in stream
// order, after the completion.
func stagingCase(t *testing.T, p *stagingPair, send, recv func() *ucp.RequestParam, sync func(), sizes []int, rmaSize int) {
	t.Helper()
	// Tag.
	for i, n := range sizes {
		src := randomBytes(n)
		dst := make([]byte, n)
		rr, err := p.b.TagRecvNbx(dst, uint64(i+1), ^uint64(0), recv())
		require.NoError(t, err)
		sr, err := p.ab.TagSendNbx(src, uint64(i+1), send())
		require.NoError(t, err)
		p.waitReqs(t, sr, rr)
		sync()
		require.Equal(t, n, rr.Length(), "tag %d bytes", n)
		require.Equal(t, crc32.ChecksumIEEE(src), crc32.ChecksumIEEE(dst), "tag %d bytes", n)
	}
	// AM: the handler copies what arrives.
	got := make(chan []byte, len(sizes))
	require.NoError(t, p.b.SetAmHandler(77, func(m *ucp.AmMessage) {
		data := make([]byte, m.Length())
		r, err := m.RecvData(data, nil)
		if err != nil {
			got <- nil
			return
		}
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if r.Wait(ctx) != nil {
				data = nil
			}
			got <- data
		}()
	}))
	for _, n := range sizes {
		src := randomBytes(n)
		sr, err := p.ab.AmSendNbx(77, []byte("h"), src, send())
		require.NoError(t, err)
		p.waitReqs(t, sr)
		var data []byte
		deadline := time.After(30 * time.Second)
	wait:
		for {
			select {
			case data = <-got:
				break wait
			case <-deadline:
				t.Fatalf("AM of %d bytes never arrived", n)
			default:
				p.b.Progress()
			}
		}
		require.Equal(t, crc32.ChecksumIEEE(src), crc32.ChecksumIEEE(data), "am %d bytes", n)
	}
	// RMA: put into b's memory, get it back.
	remote, rkey := p.remoteRegion(t, rmaSize)
	src := randomBytes(rmaSize)
	pr, err := p.ab.PutNbx(src, rkey.Base(), rkey, send())
	require.NoError(t, err)
	p.waitReqs(t, pr)
	fr, err := p.ab.FlushNbx(nil)
	require.NoError(t, err)
	p.waitReqs(t, fr)
	require.Equal(t, crc32.ChecksumIEEE(src), crc32.ChecksumIEEE(remote.Bytes()[:rmaSize]), "put %d bytes", rmaSize)
	back := make([]byte, rmaSize)
	gr, err := p.ab.GetNbx(back, rkey.Base(), rkey, send())
	require.NoError(t, err)
	p.waitReqs(t, gr)
	sync()
	require.Equal(t, crc32.ChecksumIEEE(src), crc32.ChecksumIEEE(back), "get %d bytes", rmaSize)
}

// StageAlways on host memory, with no condition and under Stream conditions on host
// streams, with the pool and through a small workspace: every byte arrives, the stats
// show that it really staged, and a workspace smaller than the operations applies
// back-pressure (waits) without failing or hanging.
func TestStageAlwaysOnHostStreams(t *testing.T) {
	backend := stream.NewHostBackend()
	defer backend.Close()
	for _, withWS := range []bool{false, true} {
		for _, mode := range []string{"plain", "stream"} {
			name := mode + "/pool"
			if withWS {
				name = mode + "/workspace"
			}
			t.Run(name, func(t *testing.T) {
				cfg := protocol.Config{Staging: protocol.StageAlways, StagingPart: 16 << 10}
				var ws *protocol.Workspace
				if withWS {
					var err error
					ws, err = protocol.NewWorkspace(backend, protocol.MinWorkspace) // 4 KiB slots
					require.NoError(t, err)
					defer func() { require.NoError(t, ws.Close()) }()
					cfg.Workspace = ws
				}
				p := newStagingPair(t, cfg)
				none := func() *ucp.RequestParam { return nil }
				send, recv := none, none
				var streams []stream.Stream
				sync := func() {
					for _, s := range streams {
						require.NoError(t, s.Synchronize())
					}
				}
				if mode == "stream" {
					cond := func() *condition.Condition {
						s, err := backend.NewStream()
						require.NoError(t, err)
						t.Cleanup(func() { _ = s.Close() })
						streams = append(streams, s)
						c, err := condition.Create(condition.Param{Category: condition.Stream, Backend: backend, Stream: s})
						require.NoError(t, err)
						t.Cleanup(func() { _ = c.Destroy() })
						return c
					}
					// One stream per side: a stream-ordered receive holds its stream
					// until the message came.
					sc, rc := cond(), cond()
					send = func() *ucp.RequestParam { return &ucp.RequestParam{Condition: sc} }
					recv = func() *ucp.RequestParam { return &ucp.RequestParam{Condition: rc} }
				}
				// 9000 B takes three 4 KiB slots; 40000 B is larger than a half (16 KiB).
				sizes := []int{8, 3000, 9000, 40000}
				const rma = 100 << 10 // 25 slot-sized parts through 4 slots
				stagingCase(t, p, send, recv, sync, sizes, rma)
				sa, sb := p.a.StagingStats(), p.b.StagingStats()
				t.Logf("sender %+v receiver %+v", sa, sb)
				sum := 0
				for _, n := range sizes {
					sum += 2 * n // tag and AM
				}
				require.GreaterOrEqual(t, sa.Bytes, uint64(sum+2*rma), "the sender staged every byte it moved")
				require.EqualValues(t, 9000+40000+3000+8, sb.Bytes, "the receiver staged its tag receives")
				require.NotZero(t, sa.HighWater)
				if withWS {
					require.NotZero(t, sa.Oversize, "the 40000 B messages are larger than a half")
					if mode == "stream" {
						// The workspace, and one 40000 B message's own 64 KiB at a time.
						require.LessOrEqual(t, sa.HighWater, uint64(ws.Size()+64<<10))
						require.NotZero(t, sa.Waits, "100 KiB of RMA through 16 KiB waits for slots")
						require.GreaterOrEqual(t, sa.Parts, uint64(2*25), "RMA moved in slot-sized parts")
					}
				}
			})
		}
	}
}

// The policy per operation overrides the context's; StageNever on host memory has a
// direct path and moves as is; an unknown policy fails at the call.
func TestStagingPolicyPerOperation(t *testing.T) {
	p := newStagingPair(t, protocol.Config{})
	src := randomBytes(5000)
	dst := make([]byte, len(src))
	rr, err := p.b.TagRecvNbx(dst, 9, ^uint64(0), &ucp.RequestParam{Staging: protocol.StageNever})
	require.NoError(t, err)
	sr, err := p.ab.TagSendNbx(src, 9, &ucp.RequestParam{Staging: protocol.StageAlways})
	require.NoError(t, err)
	p.waitReqs(t, sr, rr)
	require.Equal(t, crc32.ChecksumIEEE(src), crc32.ChecksumIEEE(dst))
	require.EqualValues(t, 5000, p.a.StagingStats().Bytes)
	require.Zero(t, p.b.StagingStats().Bytes)
	_, err = p.ab.TagSendNbx(src, 9, &ucp.RequestParam{Staging: protocol.PreferPull + 1})
	require.ErrorIs(t, err, ucp.ErrInvalidParam)
	_, err = ucp.NewContext(ucp.ContextParams{Protocol: protocol.Config{Staging: protocol.PreferPull + 1}})
	require.ErrorIs(t, err, ucp.ErrInvalidParam)
}

// Without a condition the CPU copies: StageAlways there refuses memory that may be
// device memory, at the call.
func TestStageAlwaysPlainRefusesNonHostMemory(t *testing.T) {
	p := newStagingPair(t, protocol.Config{Staging: protocol.StageAlways})
	_, err := p.ab.TagSendNbx(make([]byte, 8), 1, &ucp.RequestParam{MemoryType: ucp.MemoryUnknown})
	require.ErrorIs(t, err, ucp.ErrUnsupported)
	require.Zero(t, p.a.StagingStats().Parts)
}
