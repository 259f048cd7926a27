package ucp

import (
	"context"
	"encoding/binary"
	"errors"
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

var tagSizes = []int{0, 1, 8, 4096, 65536, 1 << 20, 16 << 20}

func TestTagSendRecvSizes(t *testing.T) {
	pairs(t, func(t *testing.T, p *pair) {
		for i, n := range tagSizes {
			src := pattern(n, int64(i))
			dst := make([]byte, n)
			rr, err := p.b.TagRecvNbx(dst, uint64(100+i), ^uint64(0), nil)
			require.NoError(t, err)
			sr, err := p.epA.TagSendNbx(src, uint64(100+i), nil)
			require.NoError(t, err)
			p.wait(t, rr, sr)
			require.NoError(t, rr.Err(), "size %d", n)
			require.NoError(t, sr.Err(), "size %d", n)
			require.Equal(t, n, rr.Length())
			require.Equal(t, uint64(100+i), rr.SenderTag())
			require.Equal(t, checksum(src), checksum(dst), "size %d", n)
		}
	})
}

// An unexpected message (sent before the receive is posted) completes the receive in
// place; the Request must still carry length and tag.
func TestTagUnexpectedImmediate(t *testing.T) {
	p := newShmPair(t)
	src := []byte("early bird")
	sr, err := p.epA.TagSendNbx(src, 5, nil)
	require.NoError(t, err)
	p.wait(t, sr)
	dst := make([]byte, 64)
	// Let b take the message into its unexpected queue, then post the receive.
	stop := time.Now().Add(20 * time.Millisecond)
	progressAll(t, 5*time.Second, func() bool { return time.Now().After(stop) }, p.a, p.b)
	rr, err := p.b.TagRecvNbx(dst, 5, ^uint64(0), nil)
	require.NoError(t, err)
	p.wait(t, rr)
	require.NoError(t, rr.Err())
	require.Equal(t, len(src), rr.Length())
	require.Equal(t, src, dst[:rr.Length()])
}

func TestTagMaskMatching(t *testing.T) {
	p := newShmPair(t)
	// Receive only tags whose high 32 bits are 0xAB; low bits are wildcards.
	const mask = 0xffffffff00000000
	dst := make([]byte, 8)
	rr, err := p.b.TagRecvNbx(dst, 0xAB_00000000, mask, nil)
	require.NoError(t, err)
	other := make([]byte, 8)
	ro, err := p.b.TagRecvNbx(other, 0xCD_00000000, mask, nil)
	require.NoError(t, err)
	// A non-matching tag must not complete rr.
	s1, err := p.epA.TagSendNbx([]byte("notmine!"), 0xCD_00000042, nil)
	require.NoError(t, err)
	p.wait(t, s1, ro)
	require.False(t, rr.Done())
	require.Equal(t, uint64(0xCD_00000042), ro.SenderTag())
	s2, err := p.epA.TagSendNbx([]byte("mine!!!!"), 0xAB_00001234, nil)
	require.NoError(t, err)
	p.wait(t, s2, rr)
	require.NoError(t, rr.Err())
	require.Equal(t, "mine!!!!", string(dst))
	require.Equal(t, uint64(0xAB_00001234), rr.SenderTag())
}

func TestTagTruncation(t *testing.T) {
	pairs(t, func(t *testing.T, p *pair) {
		for _, n := range []int{64, 1 << 20} { // eager and rendezvous
			dst := make([]byte, n/2)
			rr, err := p.b.TagRecvNbx(dst, 9, ^uint64(0), nil)
			require.NoError(t, err)
			sr, err := p.epA.TagSendNbx(pattern(n, 1), 9, nil)
			require.NoError(t, err)
			p.wait(t, rr, sr)
			require.ErrorIs(t, rr.Err(), ErrMessageTruncated, "size %d", n)
			var opErr *OpError
			require.ErrorAs(t, rr.Err(), &opErr)
			require.Equal(t, "tag_recv_nbx", opErr.Op)
		}
	})
}

func TestCancelPostedReceive(t *testing.T) {
	p := newShmPair(t)
	var cbErr atomic.Value
	rr, err := p.b.TagRecvNbx(make([]byte, 16), 77, ^uint64(0), &RequestParam{
		Callback: func(r *Request) { cbErr.Store(r.Err()) },
	})
	require.NoError(t, err)
	require.False(t, rr.Done())
	rr.Cancel()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.ErrorIs(t, rr.Wait(ctx), ErrCanceled)
	require.ErrorIs(t, cbErr.Load().(error), ErrCanceled)
	rr.Cancel() // canceling a done request is harmless
}

func TestWaitHonoursContext(t *testing.T) {
	p := newShmPair(t)
	rr, err := p.b.TagRecvNbx(make([]byte, 16), 78, ^uint64(0), nil)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	require.ErrorIs(t, rr.Wait(ctx), context.DeadlineExceeded)
	require.False(t, rr.Done())
	require.Less(t, time.Since(start), 5*time.Second)
	rr.Cancel()
	require.ErrorIs(t, rr.Wait(context.Background()), ErrCanceled)
}

func TestCallbackOnNonImmediateCompletion(t *testing.T) {
	p := newShmPair(t)
	var calls atomic.Int32
	sr, err := p.epA.TagSendNbx([]byte("x"), 1, &RequestParam{
		Flags:    NoImmediateCompletion,
		Callback: func(r *Request) { calls.Add(1) },
	})
	require.NoError(t, err)
	rr, err := p.b.TagRecvNbx(make([]byte, 1), 1, ^uint64(0), nil)
	require.NoError(t, err)
	p.wait(t, sr, rr)
	require.Equal(t, int32(1), calls.Load())
}

func TestActiveMessages(t *testing.T) {
	pairs(t, func(t *testing.T, p *pair) {
		type got struct {
			header []byte
			data   []byte
			rndv   bool
			req    *Request
			err    error
		}
		msgs := make(chan got, 4)
		require.NoError(t, p.b.SetAmHandler(3, func(m *AmMessage) {
			// Handlers must not block on progress of a peer that this same goroutine
			// drives: post the receive and let the test wait for it.
			g := got{header: m.Header, rndv: m.IsRendezvous(), data: make([]byte, m.Length())}
			g.req, g.err = m.RecvData(g.data, nil)
			msgs <- g
		}))
		for _, tc := range []struct {
			n     int
			flags AmSendFlags
			rndv  bool
		}{{0, 0, false}, {100, AmEager, false}, {4 << 20, AmRendezvous, true}} {
			data := pattern(tc.n, 9)
			hdr := []byte("hdr-" + time.Now().String())
			sr, err := p.epA.AmSendNbx(3, hdr, data, &RequestParam{AmFlags: tc.flags})
			require.NoError(t, err)
			var g got
			progressAll(t, 20*time.Second, func() bool {
				select {
				case g = <-msgs:
					return true
				default:
					return false
				}
			}, p.a, p.b)
			require.NoError(t, g.err)
			p.wait(t, sr, g.req)
			require.NoError(t, sr.Err())
			require.NoError(t, g.req.Err())
			require.Equal(t, tc.n, g.req.Length())
			require.Equal(t, hdr, g.header)
			require.Equal(t, tc.rndv, g.rndv, "size %d", tc.n)
			require.Equal(t, checksum(data), checksum(g.data), "size %d", tc.n)
		}
		require.NoError(t, p.b.SetAmHandler(3, nil))
	})
}

// An active message that arrives while its worker closes is handed to its handler
// before UCX's worker goes, with its data intact: Close's own progress receives it,
// and a handler that ran after ucp_worker_destroy read UCX's buffers after they were
// gone (a crash seen once in CI). A message kept past Close has no data any more.
func TestActiveMessageDuringClose(t *testing.T) {
	delivered := 0
	for round := 0; round < 100 && delivered < 5; round++ {
		p := newShmPair(t)
		data := pattern(200, int64(round))
		got := make(chan []byte, 2)
		var kept *AmMessage
		require.NoError(t, p.b.SetAmHandler(7, func(m *AmMessage) {
			got <- append([]byte(nil), m.Data()...)
			m.Retain()
			kept = m
		}))
		// Wire the active messages up: one message, delivered while both progress.
		_, err := p.epA.AmSendNbx(7, nil, []byte("wire-up!"), &RequestParam{AmFlags: AmEager})
		require.NoError(t, err)
		progressAll(t, 10*time.Second, func() bool { return len(got) == 1 }, p.a, p.b)
		<-got
		kept.Release()
		// Then one sent while b does not progress, a progressing all along: Close's
		// own progress receives it.
		_, err = p.epA.AmSendNbx(7, nil, data, &RequestParam{AmFlags: AmEager})
		require.NoError(t, err)
		stop := make(chan struct{})
		sending := make(chan struct{})
		go func() {
			defer close(sending)
			untilClosed(stop, func() { p.a.Progress() })
		}()
		time.Sleep(5 * time.Millisecond) // a loaded machine gives a's goroutine its turn
		require.NoError(t, p.b.Close())
		close(stop)
		<-sending
		select {
		case g := <-got:
			delivered++
			require.Equal(t, data, g, "round %d", round)
			require.Nil(t, kept.Data(), "UCX's buffer went with the worker")
			kept.Release()
		default: // not received before the worker went: nobody was handed freed memory
		}
	}
	require.Positive(t, delivered, "Close received none of the messages: the test tested nothing")
}

func TestActiveMessageReply(t *testing.T) {
	p := newPair(t, map[string]string{"TLS": "tcp"})
	require.NoError(t, p.b.SetAmHandler(1, func(m *AmMessage) {
		ep := m.ReplyEndpoint()
		if ep == nil {
			return
		}
		reply := append([]byte("re:"), m.Data()...)
		_, _ = ep.AmSendNbx(2, nil, reply, nil)
	}))
	replies := make(chan string, 1)
	require.NoError(t, p.a.SetAmHandler(2, func(m *AmMessage) { replies <- string(m.Data()) }))
	_, err := p.epA.AmSendNbx(1, nil, []byte("ping"), &RequestParam{AmFlags: AmReply})
	require.NoError(t, err)
	var got string
	progressAll(t, 10*time.Second, func() bool {
		select {
		case got = <-replies:
			return true
		default:
			return false
		}
	}, p.a, p.b)
	require.Equal(t, "re:ping", got)
}

func TestPutGet(t *testing.T) {
	pairs(t, func(t *testing.T, p *pair) {
		const n = 8 << 20
		remote, err := p.ctxB.MemAlloc(n)
		require.NoError(t, err)
		packed, err := remote.PackRkey()
		require.NoError(t, err)
		rkey, err := p.epA.UnpackRkey(packed)
		require.NoError(t, err)
		require.Equal(t, uint64(remote.Address()), rkey.Base())
		for _, size := range []int{8, 4096, n} {
			src := pattern(size, int64(size))
			pr, err := p.epA.PutNbx(src, rkey.Base(), rkey, nil)
			require.NoError(t, err)
			fr, err := p.epA.FlushNbx(nil)
			require.NoError(t, err)
			p.wait(t, pr, fr)
			require.NoError(t, pr.Err())
			require.NoError(t, fr.Err())
			require.Equal(t, checksum(src), checksum(remote.Bytes()[:size]), "put %d", size)
			back := make([]byte, size)
			gr, err := p.epA.GetNbx(back, rkey.Base(), rkey, nil)
			require.NoError(t, err)
			p.wait(t, gr)
			require.NoError(t, gr.Err())
			require.Equal(t, checksum(src), checksum(back), "get %d", size)
		}
		// Offsets inside the region work; ranges outside are refused before UCX sees them.
		_, err = p.epA.PutNbx(make([]byte, 16), rkey.Base()+n-16, rkey, nil)
		require.NoError(t, err)
		_, err = p.epA.PutNbx(make([]byte, 16), rkey.Base()+n-8, rkey, nil)
		require.ErrorIs(t, err, ErrOutOfRange)
		_, err = p.epA.GetNbx(make([]byte, 1), rkey.Base()-1, rkey, nil)
		require.ErrorIs(t, err, ErrOutOfRange)
		fr, err := p.a.FlushNbx(nil)
		require.NoError(t, err)
		p.wait(t, fr)
		require.NoError(t, rkey.Close())
		require.ErrorIs(t, rkey.Close(), ErrClosed)
		_, err = p.epA.PutNbx(make([]byte, 8), rkey.Base(), rkey, nil)
		require.ErrorIs(t, err, ErrClosed)
		require.NoError(t, remote.Close())
	})
}

func TestMemMapUserBuffer(t *testing.T) {
	p := newShmPair(t)
	user := make([]byte, 1<<16)
	m, err := p.ctxB.MemMap(user)
	require.NoError(t, err)
	packed, err := m.PackRkey()
	require.NoError(t, err)
	rkey, err := p.epA.UnpackRkey(packed)
	require.NoError(t, err)
	src := pattern(len(user), 3)
	pr, err := p.epA.PutNbx(src, rkey.Base(), rkey, nil)
	require.NoError(t, err)
	fr, err := p.epA.FlushNbx(nil)
	require.NoError(t, err)
	p.wait(t, pr, fr)
	require.Equal(t, checksum(src), checksum(user))
	require.NoError(t, m.Close())
	require.ErrorIs(t, m.Close(), ErrClosed)
}

func TestAtomics(t *testing.T) {
	pairs(t, func(t *testing.T, p *pair) {
		remote, err := p.ctxB.MemAlloc(64)
		require.NoError(t, err)
		packed, err := remote.PackRkey()
		require.NoError(t, err)
		rkey, err := p.epA.UnpackRkey(packed)
		require.NoError(t, err)
		mem := remote.Bytes()
		base := rkey.Base()
		do := func(a AtomicParam, off uint64) *Request {
			r, err := p.epA.AtomicNbx(a, base+off, rkey, nil)
			require.NoError(t, err)
			p.wait(t, r)
			require.NoError(t, r.Err())
			return r
		}
		binary.NativeEndian.PutUint64(mem[0:], 40)
		r := do(AtomicParam{Op: AtomicAdd, Operand: 2, Fetch: true}, 0)
		require.Equal(t, uint64(40), r.Fetched())
		require.Equal(t, uint64(42), binary.NativeEndian.Uint64(mem[0:]))
		r = do(AtomicParam{Op: AtomicSwap, Operand: 7}, 0)
		require.Equal(t, uint64(42), r.Fetched())
		require.Equal(t, uint64(7), binary.NativeEndian.Uint64(mem[0:]))
		r = do(AtomicParam{Op: AtomicCswap, Operand: 99, Swap: 1}, 0) // compare fails
		require.Equal(t, uint64(7), r.Fetched())
		require.Equal(t, uint64(7), binary.NativeEndian.Uint64(mem[0:]))
		r = do(AtomicParam{Op: AtomicCswap, Operand: 7, Swap: 1000}, 0) // compare holds
		require.Equal(t, uint64(7), r.Fetched())
		require.Equal(t, uint64(1000), binary.NativeEndian.Uint64(mem[0:]))
		// 32-bit add without fetch on the second word.
		binary.NativeEndian.PutUint32(mem[8:], 0xfffffffe)
		do(AtomicParam{Op: AtomicAdd, Size: 4, Operand: 3}, 8)
		fr, err := p.epA.FlushNbx(nil)
		require.NoError(t, err)
		p.wait(t, fr)
		require.Equal(t, uint32(1), binary.NativeEndian.Uint32(mem[8:]))
		// Bad atomic parameters.
		_, err = p.epA.AtomicNbx(AtomicParam{Op: AtomicAdd, Size: 3}, base, rkey, nil)
		require.ErrorIs(t, err, ErrInvalidParam)
		_, err = p.epA.AtomicNbx(AtomicParam{Op: AtomicOp(42)}, base, rkey, nil)
		require.ErrorIs(t, err, ErrInvalidParam)
		_, err = p.epA.AtomicNbx(AtomicParam{Op: AtomicAdd}, base+4, rkey, nil)
		require.ErrorIs(t, err, ErrInvalidParam)
		_, err = p.epA.AtomicNbx(AtomicParam{Op: AtomicAdd}, base+uint64(remote.Len()), rkey, nil)
		require.ErrorIs(t, err, ErrOutOfRange)
		require.NoError(t, remote.Close())
	})
}

// A 32-bit atomic refuses, at the call, an operand (or Cswap's swap value) wider than
// 32 bits: UCX would get it truncated, so Cswap would compare and swap other values.
func TestAtomic32RefusesWideOperand(t *testing.T) {
	p := newShmPair(t)
	remote, err := p.ctxB.MemAlloc(64)
	require.NoError(t, err)
	pk, err := remote.PackRkey()
	require.NoError(t, err)
	rk, err := p.epA.UnpackRkey(pk)
	require.NoError(t, err)
	binary.NativeEndian.PutUint32(remote.Bytes(), 7)
	for _, a := range []AtomicParam{
		{Op: AtomicCswap, Size: 4, Operand: 1<<32 | 7, Swap: 9}, // compares 7 truncated
		{Op: AtomicCswap, Size: 4, Operand: 7, Swap: 1<<32 | 9},
		{Op: AtomicAdd, Size: 4, Operand: 1<<32 | 1},
		{Op: AtomicSwap, Size: 4, Operand: 1 << 40},
	} {
		r, err := p.epA.AtomicNbx(a, rk.Base(), rk, nil)
		if err == nil {
			p.wait(t, r)
		}
		require.ErrorIs(t, err, ErrInvalidParam, "%+v", a)
		require.Nil(t, r)
	}
	require.EqualValues(t, 7, binary.NativeEndian.Uint32(remote.Bytes()), "nothing reached the word")
	// The widest 32-bit values go through.
	r, err := p.epA.AtomicNbx(AtomicParam{Op: AtomicCswap, Size: 4, Operand: 7, Swap: math.MaxUint32}, rk.Base(), rk, nil)
	require.NoError(t, err)
	p.wait(t, r)
	require.EqualValues(t, 7, r.Fetched())
	require.EqualValues(t, uint32(math.MaxUint32), binary.NativeEndian.Uint32(remote.Bytes()))
}

func TestConcurrentSendersAndReceivers(t *testing.T) {
	p := newShmPair(t)
	const goroutines, perG = 8, 200
	var wg sync.WaitGroup
	errs := make(chan error, 2*goroutines)
	for g := 0; g < goroutines; g++ {
		wg.Add(2)
		go func(g int) {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			for i := 0; i < perG; i++ {
				buf := make([]byte, 256)
				r, err := p.b.TagRecvNbx(buf, uint64(g)<<32|uint64(i), ^uint64(0), nil)
				if err == nil {
					err = r.Wait(ctx)
				}
				if err == nil && binary.LittleEndian.Uint64(buf) != uint64(g*perG+i) {
					err = errors.New("payload mismatch")
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}(g)
		go func(g int) {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			for i := 0; i < perG; i++ {
				buf := make([]byte, 256)
				binary.LittleEndian.PutUint64(buf, uint64(g*perG+i))
				r, err := p.epA.TagSendNbx(buf, uint64(g)<<32|uint64(i), nil)
				if err == nil {
					err = r.Wait(ctx)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}(g)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
}

func TestBadInputs(t *testing.T) {
	p := newPair(t, map[string]string{"TLS": "tcp"})

	_, err := p.ctxA.MemMap(nil)
	require.ErrorIs(t, err, ErrInvalidParam)
	_, err = p.ctxA.MemMap([]byte{})
	require.ErrorIs(t, err, ErrInvalidParam)
	_, err = p.ctxA.MemAlloc(-1)
	require.ErrorIs(t, err, ErrInvalidParam)
	_, err = p.ctxA.MemAlloc(0)
	require.ErrorIs(t, err, ErrInvalidParam)
	_, err = p.ctxA.MemAlloc(1 << 62) // absurd size
	require.Error(t, err)
	// More than the machine has: refused at the call, before UCX's allocator writes
	// that much into shared memory (which filled the machine until the kernel killed
	// the process).
	if avail, ok := availableMemory(); ok {
		_, err = p.ctxA.MemAlloc(int(avail + 1<<30))
		require.ErrorIs(t, err, ErrNoMemory)
	}
	_, err = p.ctxA.MemMapPtr(0, 10, MemoryHost)
	require.ErrorIs(t, err, ErrInvalidParam)
	_, err = NewContext(ContextParams{EstimatedEndpoints: -5})
	require.ErrorIs(t, err, ErrInvalidParam)
	_, err = NewContext(ContextParams{Features: FeatureTag | Feature(1<<40)})
	require.ErrorIs(t, err, ErrInvalidParam, "an unknown feature bit")
	_, err = NewContext(ContextParams{Config: map[string]string{"RNDV_THRESH": "not-a-size"}})
	require.Error(t, err)

	// Garbage rkeys and worker addresses never reach UCX.
	for _, garbage := range [][]byte{nil, {}, []byte("garbage"), pattern(200, 7)} {
		_, err = p.epA.UnpackRkey(garbage)
		require.ErrorIs(t, err, ErrInvalidParam)
		_, err = p.a.ConnectAddress(garbage, nil)
		require.ErrorIs(t, err, ErrInvalidAddr)
	}
	m, err := p.ctxB.MemAlloc(64)
	require.NoError(t, err)
	packed, err := m.PackRkey()
	require.NoError(t, err)
	packed[len(packed)/2] ^= 0xff // one flipped byte
	_, err = p.epA.UnpackRkey(packed)
	require.ErrorIs(t, err, ErrInvalidParam)
	_, err = p.epA.PutNbx([]byte("x"), 0, nil, nil)
	require.ErrorIs(t, err, ErrInvalidParam)

	// Addresses.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, bad := range []string{"", "nohostport", "127.0.0.1:99999", "127.0.0.1:0", "127.0.0.1:x"} {
		_, err = p.a.Connect(ctx, bad, nil)
		require.ErrorIs(t, err, ErrInvalidAddr, bad)
	}
	_, err = p.a.Listen("127.0.0.1:99999", nil)
	require.ErrorIs(t, err, ErrInvalidAddr)
	require.ErrorIs(t, p.b.SetAmHandler(1<<16, func(*AmMessage) {}), ErrInvalidParam)
	_, err = p.epA.AmSendNbx(1<<16, nil, nil, nil)
	require.ErrorIs(t, err, ErrInvalidParam)

	// Tags above MaxTag: the top bits are the sender's source id.
	_, err = p.epA.TagSendNbx([]byte("x"), MaxTag+1, nil)
	require.ErrorIs(t, err, ErrInvalidParam)
	_, err = p.a.TagRecvNbx(make([]byte, 1), ^uint64(0), ^uint64(0), nil)
	require.ErrorIs(t, err, ErrInvalidParam)
	require.ErrorIs(t, p.epA.TagSend(ctx, []byte("x"), 1<<63), ErrInvalidParam)

	require.NoError(t, m.Close())
}

func TestConnectToPortNobodyListensOn(t *testing.T) {
	ctx, err := NewContext(ContextParams{Config: map[string]string{"TLS": "tcp"}})
	require.NoError(t, err)
	defer ctx.Close()
	w, err := ctx.NewWorker(WorkerParams{})
	require.NoError(t, err)
	// Find a free port, then close it so nobody listens there.
	l, err := w.Listen("127.0.0.1:0", nil)
	require.NoError(t, err)
	addr := l.Addr()
	require.NoError(t, l.Close())
	c, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	start := time.Now()
	_, err = w.Connect(c, addr, nil)
	require.Error(t, err)
	require.ErrorIs(t, err, ErrPeerFailed, "got %v", err)
	require.Less(t, time.Since(start), 15*time.Second)
}

func TestClosedObjects(t *testing.T) {
	p := newPair(t, map[string]string{"TLS": "tcp"})
	stop := background(p.b) // a graceful close flushes, which needs the peer's progress
	require.NoError(t, p.epA.Close())
	stop()
	require.ErrorIs(t, p.epA.Close(), ErrClosed)
	_, err := p.epA.TagSendNbx([]byte("x"), 1, nil)
	require.ErrorIs(t, err, ErrClosed)
	_, err = p.epA.FlushNbx(nil)
	require.ErrorIs(t, err, ErrClosed)
	_, err = p.epA.AmSendNbx(1, nil, nil, nil)
	require.ErrorIs(t, err, ErrClosed)
	_, err = p.epA.CloseNbx(true)
	require.ErrorIs(t, err, ErrClosed)

	pending, err := p.b.TagRecvNbx(make([]byte, 8), 1, ^uint64(0), nil)
	require.NoError(t, err)
	require.NoError(t, p.b.Close())
	require.True(t, pending.Done(), "worker close completes pending requests")
	require.ErrorIs(t, pending.Err(), ErrCanceled)
	require.ErrorIs(t, p.b.Close(), ErrClosed)
	_, err = p.b.TagRecvNbx(make([]byte, 8), 1, ^uint64(0), nil)
	require.ErrorIs(t, err, ErrClosed)
	_, err = p.b.Address()
	require.ErrorIs(t, err, ErrClosed)
	_, err = p.b.Listen("127.0.0.1:0", nil)
	require.ErrorIs(t, err, ErrClosed)
	_, err = p.epB.TagSendNbx([]byte("x"), 1, nil)
	require.ErrorIs(t, err, ErrClosed)
	require.Equal(t, 0, p.b.Progress())
	require.ErrorIs(t, p.b.WaitForEvents(context.Background(), time.Millisecond), ErrClosed)

	require.NoError(t, p.ctxB.Close())
	require.ErrorIs(t, p.ctxB.Close(), ErrClosed)
	_, err = p.ctxB.NewWorker(WorkerParams{})
	require.ErrorIs(t, err, ErrClosed)
	_, err = p.ctxB.MemAlloc(8)
	require.ErrorIs(t, err, ErrClosed)
	require.NoError(t, p.ctxA.Close())
	p.ctxA, p.ctxB = nil, nil
}

func TestMemoryTypes(t *testing.T) {
	ctx, err := NewContext(ContextParams{})
	require.NoError(t, err)
	defer ctx.Close()
	require.Contains(t, ctx.MemoryTypes(), MemoryHost)
	require.True(t, ctx.SupportsMemoryType(MemoryHost))
	require.False(t, ctx.SupportsMemoryType(MemoryUnknown))
}

func TestNoLeaksAfterClose(t *testing.T) {
	baseline := runtime.NumGoroutine()
	func() {
		p := newPair(t, map[string]string{"TLS": "tcp"})
		m, err := p.ctxB.MemAlloc(4096)
		require.NoError(t, err)
		packed, err := m.PackRkey()
		require.NoError(t, err)
		_, err = p.epA.UnpackRkey(packed)
		require.NoError(t, err)
		_, err = p.b.TagRecvNbx(make([]byte, 8), 1, ^uint64(0), nil)
		require.NoError(t, err)
		require.NoError(t, p.a.SetAmHandler(5, func(*AmMessage) {}))
		p.close(t)
		p.ctxA, p.ctxB = nil, nil
	}()
	requireNoLeaks(t)
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > baseline && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	require.LessOrEqual(t, runtime.NumGoroutine(), baseline)
}

func TestDeviceMemoryTypeWithoutTransport(t *testing.T) {
	p := newShmPair(t)
	if p.ctxA.SupportsMemoryType(MemoryCUDA) {
		t.Skip("this UCX has a CUDA transport")
	}
	_, err := p.epA.TagSendNbx(make([]byte, 8), 1, &RequestParam{MemoryType: MemoryCUDA})
	require.ErrorIs(t, err, ErrUnsupported)
	_, err = p.a.TagRecvNbx(make([]byte, 8), 1, 1, &RequestParam{MemoryType: MemoryCUDAManaged})
	require.ErrorIs(t, err, ErrUnsupported)
	require.Nil(t, DeviceBuffer(0, 8))
}

// MemAlloc's region is exactly what was asked for, though UCX allocates whole pages:
// Bytes, Len and the rkey's range agree.
func TestMemAllocIsExact(t *testing.T) {
	p := newShmPair(t)
	defer p.close(t)
	m, err := p.ctxB.MemAlloc(4)
	require.NoError(t, err)
	defer m.Close()
	require.Len(t, m.Bytes(), 4)
	require.Equal(t, 4, m.Len())
	key, err := m.PackRkey()
	require.NoError(t, err)
	rk, err := p.epA.UnpackRkey(key)
	require.NoError(t, err)
	require.Equal(t, 4, rk.Len())
	_, err = p.epA.PutNbx(make([]byte, 5), rk.Base(), rk, nil)
	require.ErrorIs(t, err, ErrOutOfRange)
}
