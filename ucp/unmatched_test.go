package ucp

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/cgo/ucx"
)

// A peer that floods messages nobody receives is cut off at the receiver's limit: its
// endpoints fail with ErrExceedsLimit, what it left unmatched is dropped, and the
// receiver's other peers keep working.
func TestUnmatchedFloodIsCutOff(t *testing.T) {
	for _, tr := range []string{"shm", "tcp"} {
		t.Run(tr, func(t *testing.T) {
			const limit = 1 << 20
			// b is the victim, a the flooder; a third worker is a well-behaved peer.
			p := addressPair(t, WorkerParams{UnmatchedLimit: limit}, tr == "shm")
			good := connectTo(t, p.b, tr == "shm")
			flood, victim, toFlooder := p.epA, p.b, p.epB

			msg := make([]byte, 4096)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			failed := make(chan error, 1)
			toFlooder.OnFailure(func(_ *Endpoint, err error) { failed <- err })
			send := func() {
				r, err := flood.TagSendNbx(msg, 7, nil)
				require.NoError(t, err)
				for !r.Done() {
					p.a.Progress()
					victim.Progress()
				}
			}
			sent := 0
			var cutErr error
			for ; sent < 64<<20 && cutErr == nil; sent += len(msg) {
				send()
				select {
				case cutErr = <-failed:
				default:
				}
			}
			require.Error(t, cutErr, "flooder sent %d bytes unmatched and was not cut off (limit %d)", sent, limit)
			require.ErrorIs(t, cutErr, ErrExceedsLimit)
			var le *UnmatchedLimitError
			require.ErrorAs(t, cutErr, &le)
			require.Equal(t, uint64(limit), le.Limit)
			require.Greater(t, le.Held, uint64(limit))
			require.LessOrEqual(t, le.Held, uint64(limit+limit/2), "cut off late")
			t.Logf("cut off after %d bytes sent, %d held", sent, le.Held)
			require.Zero(t, toFlooder.UnmatchedHeld(), "the flooder's messages are dropped")
			_, err := toFlooder.TagSendNbx(msg, 1, nil)
			require.ErrorIs(t, err, ErrExceedsLimit)

			// What it sends later is dropped too (the victim's memory stays bounded), and
			// a receive for its tag stays empty.
			rss0 := rssBytes(t)
			for i := 0; i < (32<<20)/len(msg); i++ {
				send()
			}
			grown := rssBytes(t) - rss0
			require.Less(t, grown, int64(8<<20), "RSS grew by %d bytes while the cut-off peer sent 32 MiB", grown)
			for i := 0; i < 1000; i++ {
				victim.Progress()
			}
			rr, err := victim.TagRecvNbx(make([]byte, len(msg)), 7, MaxTag, nil)
			require.NoError(t, err)
			for i := 0; i < 1000; i++ {
				victim.Progress()
			}
			// Still in flight when it was cut off, a message may meet the posted receive:
			// it fails then, with the peer's error.
			if rr.Done() {
				require.ErrorIs(t, rr.Err(), ErrExceedsLimit, "a message of the cut-off peer was delivered")
			}
			rr.Cancel()

			// The good peer is untouched.
			payload := []byte("still served")
			gr, err := good.TagSendNbx(payload, 9, nil)
			require.NoError(t, err)
			in := make([]byte, 32)
			gotR, err := victim.TagRecvNbx(in, 9, MaxTag, nil)
			require.NoError(t, err)
			for (!gr.Done() || !gotR.Done()) && ctx.Err() == nil {
				good.Worker().Progress()
				victim.Progress()
			}
			require.NoError(t, gr.Err())
			require.NoError(t, gotR.Err())
			require.Equal(t, uint64(9), gotR.SenderTag())
			require.Equal(t, payload, in[:gotR.Length()])
		})
	}
}

// rssBytes is the process's resident set size.
func rssBytes(t *testing.T) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/statm")
	require.NoError(t, err)
	var size, rss int64
	_, err = fmt.Sscan(string(b), &size, &rss)
	require.NoError(t, err)
	return rss * int64(os.Getpagesize())
}

// connectTo makes a third context and worker with an endpoint to w.
func connectTo(t *testing.T, w *Worker, shm bool) *Endpoint {
	t.Helper()
	c, err := NewContext(ContextParams{})
	require.NoError(t, err)
	x, err := c.NewWorker(WorkerParams{})
	require.NoError(t, err)
	addr, err := w.Address()
	require.NoError(t, err)
	ep, err := x.ConnectAddress(addr, &EndpointParams{NoPeerErrorHandling: shm})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = ep.closeWith(true, time.Second)
		_ = x.Close()
		_ = c.Close()
	})
	return ep
}

// Messages that sat unexpected long enough to be taken into the ledger's queue are
// received exactly as UCX alone would deliver them: in order per tag, wildcards
// included, eager and rendezvous sizes, with their sender tags and checksums.
func TestUnmatchedQueueKeepsMatchingOrder(t *testing.T) {
	p := shmPairWith(t, WorkerParams{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// a sends, b receives (b has the default limit, so its ledger looks).
	sizes := []int{0, 8, 4096, 300 << 10}
	const n = 48
	var sends []*Request
	for i := 0; i < n; i++ {
		b := make([]byte, sizes[i%len(sizes)])
		for j := range b {
			b[j] = byte(i*31 + j)
		}
		tag := uint64(100 + i%3)
		r, err := p.epA.TagSendNbx(b, tag, nil)
		require.NoError(t, err)
		sends = append(sends, r)
	}
	takeUnmatched(p, 20000)
	taken, _ := p.b.raw.UnmatchedCounts()
	require.Greater(t, taken, uint64(0), "nothing was taken into the queue")

	want := func(i int) (uint64, uint32) {
		b := make([]byte, sizes[i%len(sizes)])
		for j := range b {
			b[j] = byte(i*31 + j)
		}
		return uint64(100 + i%3), crc32.ChecksumIEEE(b)
	}
	// Tag 101 first (in order), then the rest with a wildcard: order by arrival.
	got := map[int]bool{}
	for i := 1; i < n; i += 3 {
		buf := make([]byte, 300<<10)
		k, tag, err := p.b.TagRecv(ctx, buf, 101, MaxTag)
		require.NoError(t, err)
		wt, wc := want(i)
		require.Equal(t, wt, tag)
		require.Equal(t, wc, crc32.ChecksumIEEE(buf[:k]), "message %d", i)
		got[i] = true
	}
	for i := 0; i < n; i++ {
		if got[i] {
			continue
		}
		buf := make([]byte, 300<<10)
		r, err := p.b.TagRecvNbx(buf, 0, 0, nil)
		require.NoError(t, err)
		require.NoError(t, r.Wait(ctx))
		wt, wc := want(i)
		require.Equal(t, wt, r.SenderTag(), "message %d", i)
		require.Equal(t, wc, crc32.ChecksumIEEE(buf[:r.Length()]), "message %d", i)
	}
	for _, r := range sends {
		require.NoError(t, r.Wait(ctx))
	}
}

// takeUnmatched progresses both workers rounds times, so that what a sent arrives
// and sits at b, then takes it into b's ledger queue, as a look that found it sitting
// does.
func takeUnmatched(p *pair, rounds int) {
	for range rounds {
		p.a.Progress()
		p.b.Progress()
	}
	p.b.mu.Lock()
	p.b.raw.TakeUnmatched()
	p.b.mu.Unlock()
}

// Tags above MaxTag are refused at the call; masks may have any bits set, and the
// sender's source bits never show in SenderTag.
func TestTagAboveMaxTag(t *testing.T) {
	p := newShmPair(t)
	_, err := p.epA.TagSendNbx([]byte{1}, MaxTag+1, nil)
	require.ErrorIs(t, err, ErrInvalidParam)
	_, err = p.b.TagRecvNbx(make([]byte, 1), 1<<63, ^uint64(0), nil)
	require.ErrorIs(t, err, ErrInvalidParam)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, _, err = p.epA.TagSendRecv(ctx, []byte{1}, 1<<60, make([]byte, 1), 1, MaxTag)
	require.ErrorIs(t, err, ErrInvalidParam)

	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], MaxTag)
	sr, err := p.epA.TagSendNbx(b[:], MaxTag, nil)
	require.NoError(t, err)
	in := make([]byte, 8)
	_, tag, err := p.b.TagRecv(ctx, in, MaxTag, ^uint64(0))
	require.NoError(t, err)
	require.Equal(t, uint64(MaxTag), tag)
	require.NoError(t, sr.Wait(ctx))
	require.False(t, errors.Is(err, ErrInvalidParam))
}

// Many messages of random sizes and tags, taken into the ledger's queue in batches
// while more keep arriving, received with a mix of exact and wildcard receives: every
// message arrives once, intact, and in order per tag (UCX's guarantee between one
// sender and one receiver).
func TestUnmatchedQueueRandomized(t *testing.T) {
	p := shmPairWith(t, WorkerParams{})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	rng := rand.New(rand.NewPCG(7, 11))
	const n, tags = 3000, 5
	type msg struct {
		tag uint64
		sum uint32
		n   int
	}
	var sent []msg
	var reqs []*Request
	for i := 0; i < n; i++ {
		size := []int{0, 8, 100, 4096, 9000, 70 << 10}[rng.IntN(6)]
		b := make([]byte, size)
		for j := range b {
			b[j] = byte(rng.IntN(256))
		}
		// The sequence number rides in the payload's first bytes where there is room.
		if size >= 8 {
			binary.LittleEndian.PutUint64(b, uint64(i))
		}
		tag := uint64(rng.IntN(tags))
		r, err := p.epA.TagSendNbx(b, tag, nil)
		require.NoError(t, err)
		reqs = append(reqs, r)
		sent = append(sent, msg{tag, crc32.ChecksumIEEE(b), size})
		if i%200 == 199 {
			takeUnmatched(p, 200)
		}
	}
	taken, _ := p.b.raw.UnmatchedCounts()
	require.Greater(t, taken, uint64(0))
	// Per tag, the order they were sent in.
	next := make(map[uint64][]int)
	for i, m := range sent {
		next[m.tag] = append(next[m.tag], i)
	}
	got := 0
	buf := make([]byte, 70<<10)
	for got < n {
		var r *Request
		var err error
		if rng.IntN(3) == 0 {
			r, err = p.b.TagRecvNbx(buf, 0, 0, nil) // any tag
		} else {
			tag := uint64(rng.IntN(tags))
			if len(next[tag]) == 0 {
				continue
			}
			r, err = p.b.TagRecvNbx(buf, tag, MaxTag, nil)
		}
		require.NoError(t, err)
		for !r.Done() && ctx.Err() == nil {
			p.a.Progress()
			p.b.Progress()
		}
		require.NoError(t, r.Err())
		tag := r.SenderTag()
		require.NotEmpty(t, next[tag], "a message of tag %d too many", tag)
		i := next[tag][0]
		next[tag] = next[tag][1:]
		require.Equal(t, sent[i].n, r.Length(), "message %d (tag %d): length", i, tag)
		require.Equal(t, sent[i].sum, crc32.ChecksumIEEE(buf[:r.Length()]), "message %d (tag %d): out of order or corrupt", i, tag)
		got++
	}
	for _, r := range reqs {
		require.NoError(t, r.Wait(ctx))
	}
}

// The source id a message is charged to is the sender's claim: a peer spreading its
// messages over many ids, each under the limit, still meets a bound on the whole
// ledger (4 limits), where the source holding most is cut off.
func TestUnmatchedTotalIsBounded(t *testing.T) {
	const limit = 256 << 10
	p := addressPair(t, WorkerParams{UnmatchedLimit: limit}, true)
	flood, victim := p.epA, p.b
	msg := make([]byte, 4096)
	sources := uint64(1) << (63 - ucx.TagBits)
	total := func() (n uint64) {
		victim.mu.Lock()
		defer victim.mu.Unlock()
		for s := range sources {
			n += victim.raw.UnmatchedHeld(s)
		}
		return n
	}
	for i := range 1024 { // 4.25 MiB charged, over 1024 claimed sources
		p.a.mu.Lock()
		p.a.raw.SetUnmatched(p.a.unmatchedLimit, uint64(100+i))
		p.a.mu.Unlock()
		r, err := flood.TagSendNbx(msg, 7, nil)
		require.NoError(t, err)
		for !r.Done() {
			p.a.Progress()
			victim.Progress()
		}
	}
	for range 20000 { // let the ledger look (it takes what sat unexpected an interval)
		victim.Progress()
	}
	held := total()
	require.LessOrEqual(t, held, uint64(4*limit), "the ledger holds %d bytes over %d claimed sources", held, 1024)
	require.Greater(t, held, uint64(limit), "the ledger took nothing")
	// Receive what is held, so that the worker closes with UCX's queue empty.
	for total() > 0 {
		r, err := victim.TagRecvNbx(make([]byte, len(msg)), 7, MaxTag, nil)
		require.NoError(t, err)
		for !r.Done() {
			victim.Progress()
		}
		require.NoError(t, r.Err())
	}
}

// With an auth key, a peer cannot charge its unmatched messages to another: the
// source id it can compute for an honest peer from what is public (its identity and
// address, as a peer without the key would) is not the one that peer's tags carry, so
// flooding under it cuts nobody off but the flooder, and the honest peer's messages
// are delivered.
func TestUnmatchedSourceCannotBeClaimedWithoutKey(t *testing.T) {
	const limit = 256 << 10
	key, err := GenerateAuthKey()
	require.NoError(t, err)
	keyed := ContextParams{AuthKey: key}
	newWorker := func(wp WorkerParams) *Worker {
		c, err := NewContext(keyed)
		require.NoError(t, err)
		w, err := c.NewWorker(wp)
		require.NoError(t, err)
		t.Cleanup(func() { _ = w.Close(); _ = c.Close() })
		return w
	}
	victim := newWorker(WorkerParams{UnmatchedLimit: limit})
	attackerW, honestW := newWorker(WorkerParams{}), newWorker(WorkerParams{})
	addr, err := victim.Address()
	require.NoError(t, err)
	noErr := &EndpointParams{NoPeerErrorHandling: true}
	attacker, err := attackerW.ConnectAddress(addr, noErr)
	require.NoError(t, err)
	honest, err := honestW.ConnectAddress(addr, noErr)
	require.NoError(t, err)
	self, err := honestW.selfInfo()
	require.NoError(t, err)
	public, err := newTrust(nil)
	require.NoError(t, err)
	claimed := sourceOf(public, self.id, self.addr)
	require.NotEqual(t, honestW.source, claimed, "the keyed id is not the public one (one chance in 2^15)")
	attackerW.mu.Lock()
	attackerW.raw.SetUnmatched(attackerW.unmatchedLimit, claimed)
	attackerW.mu.Unlock()
	drive := func(r *Request, ws ...*Worker) {
		for deadline := time.Now().Add(10 * time.Second); !r.Done(); {
			for _, w := range ws {
				w.Progress()
			}
			require.True(t, time.Now().Before(deadline), "request pending")
		}
	}
	msg := make([]byte, 4096)
	for range 2 * limit / len(msg) {
		r, err := attacker.TagSendNbx(msg, 7, nil)
		require.NoError(t, err)
		drive(r, attackerW, victim)
	}
	for range 20000 {
		attackerW.Progress()
		victim.Progress()
	}
	victim.mu.Lock()
	victim.raw.TakeUnmatched() // the ledger's look, as a busy worker makes it
	victim.mu.Unlock()
	payload := []byte("from the honest peer")
	sr, err := honest.TagSendNbx(payload, 9, nil)
	require.NoError(t, err)
	drive(sr, honestW, victim)
	in := make([]byte, 64)
	rr, err := victim.TagRecvNbx(in, 9, MaxTag, nil)
	require.NoError(t, err)
	drive(rr, honestW, victim)
	require.NoError(t, rr.Err())
	require.Equal(t, payload, in[:rr.Length()])
}
