package prepare_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/condition"
	"github.com/ucpx/ucpx/stream"
	"github.com/ucpx/ucpx/ucp"
)

// Benchmarks of a prepared partitioned iteration against what it replaces, both
// measured in the same run and interleaved (alternating blocks of iterations), and
// reported as ratios with b.ReportMetric; nothing is asserted about time.
//
//	BenchmarkPartitioned64x4K  64 partitions of 4 KiB: prepared (Start, 64 Pready, Wait on
//	                           both sides) against today's workaround: one KernelTriggered
//	                           condition per partition, one tag send per partition and
//	                           iteration armed with it and triggered with
//	                           condition.Trigger once the partition is written, the
//	                           receiver posting 64 tag receives per iteration
//	                           (target: ratio ≤ 1/3)
//	BenchmarkPartitioned8x4K   8 partitions of 4 KiB: prepared against the same 8
//	                           PutSignalNbx (the same remote buffer layout and signal
//	                           words, ucp.Worker.NewSignals) from a tight loop, waited
//	                           for (target: ratio ≤ 1.2)
//
// Metrics: ns/op is the prepared iteration; <reference>-ns/op the reference's; ratio
// = prepared / reference. Two workers of one process, over shm and over tcp, each in
// two forms:
//
//	seq  one goroutine runs both sides, each iteration complete before the next: the
//	     receiver's part of the start (Start / posting the receives), the sender's whole
//	     iteration, then the receiver's wait. The cost of an iteration, with nothing
//	     overlapped.
//	2g   the sender and the receiver each loop in a goroutine of their own, as two
//	     processes would. The tight PutSignalNbx loop is then not held back by the
//	     receiver at all (it has no readiness step), so this is prepared against the
//	     streaming floor; BenchmarkPartitioned8x4KHandshake puts the same loop behind
//	     the receiver's readiness, as prepared requests are.

const (
	benchWarmup = 50  // iterations of each variant before timing
	benchBlock  = 128 // iterations of one variant before the other takes over
)

// partVariant is one way of moving an iteration of partitions. Its waits call poll,
// when not nil, between tests of what they wait for (one goroutine running both
// sides must progress the other side's worker); with a nil poll they wait as an
// application would (Wait).
type partVariant struct {
	name string
	// recvBegin: the receiver's part before the data (Start; posting receives).
	recvBegin func(ctx context.Context, it int) error
	// send: the sender's whole iteration (write each partition's stamp, make it move,
	// wait for local completion).
	send func(ctx context.Context, it int, poll func()) error
	// recvEnd: the receiver waits for iteration it and checks the stamps (exact: every
	// partition carries it; otherwise the sender may already be ahead).
	recvEnd func(ctx context.Context, it int, poll func(), exact bool) error

	sender, receiver *ucp.Worker
	iter             int // iterations run so far
}

// run runs n iterations of v and returns the time they took.
func (v *partVariant) run(ctx context.Context, n int, concurrent bool) (time.Duration, error) {
	first := v.iter + 1
	v.iter += n
	if !concurrent {
		// One goroutine: whatever a side waits for may need the other side's progress.
		sendPoll := func() { v.receiver.Progress() }
		recvPoll := func() { v.sender.Progress() }
		start := time.Now()
		for it := first; it < first+n; it++ {
			if err := v.recvBegin(ctx, it); err != nil {
				return 0, err
			}
			if err := v.send(ctx, it, sendPoll); err != nil {
				return 0, err
			}
			if err := v.recvEnd(ctx, it, recvPoll, true); err != nil {
				return 0, err
			}
		}
		return time.Since(start), nil
	}
	start := time.Now()
	recvErr := make(chan error, 1)
	go func() {
		for it := first; it < first+n; it++ {
			if err := v.recvBegin(ctx, it); err != nil {
				recvErr <- err
				return
			}
			if err := v.recvEnd(ctx, it, nil, false); err != nil {
				recvErr <- err
				return
			}
		}
		recvErr <- nil
	}()
	var sendErr error
	for it := first; it < first+n && sendErr == nil; it++ {
		sendErr = v.send(ctx, it, nil)
	}
	// The sender's process goes on progressing its worker until the receiver is done:
	// ucp.Endpoint.PutSignalNbx can complete its Request while the signal still waits
	// in UCX, and only the sender's progress sends it.
	var err error
	for received := false; !received; {
		select {
		case err = <-recvErr:
			received = true
		default:
			v.sender.Progress()
		}
	}
	elapsed := time.Since(start)
	if sendErr != nil {
		return 0, fmt.Errorf("%s send: %w", v.name, sendErr)
	}
	if err != nil {
		return 0, fmt.Errorf("%s receive: %w", v.name, err)
	}
	return elapsed, nil
}

// compare runs b.N iterations of each variant, alternating blocks, and reports the
// prepared one's time per iteration as ns/op, the reference's, and their ratio.
func compare(b *testing.B, prepared, ref *partVariant, concurrent bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for _, v := range []*partVariant{prepared, ref} {
		if _, err := v.run(ctx, benchWarmup, concurrent); err != nil {
			b.Fatalf("%s warm-up: %v", v.name, err)
		}
	}
	b.ResetTimer()
	var tp, tr time.Duration
	for done := 0; done < b.N; {
		n := min(benchBlock, b.N-done)
		d, err := prepared.run(ctx, n, concurrent)
		if err != nil {
			b.Fatal(err)
		}
		tp += d
		if d, err = ref.run(ctx, n, concurrent); err != nil {
			b.Fatal(err)
		}
		tr += d
		done += n
	}
	b.StopTimer()
	pns := float64(tp.Nanoseconds()) / float64(b.N)
	rns := float64(tr.Nanoseconds()) / float64(b.N)
	b.ReportMetric(pns, "ns/op")
	b.ReportMetric(rns, ref.name+"-ns/op")
	b.ReportMetric(pns/rns, "ratio")
}

var benchLinks = []struct {
	name string
	make func(testing.TB) *link
}{{"shm", flushed(shmLink)}, {"tcp", flushed(tcpLink)}}

// flushed makes a link whose endpoints are flushed (flushLink) before its contexts
// close, whatever ended the benchmark.
func flushed(mk func(testing.TB) *link) func(testing.TB) *link {
	return func(t testing.TB) *link {
		l := mk(t)
		t.Cleanup(func() { flushLink(t, l) }) // before mk's cleanup, which closes the contexts
		return l
	}
}

// flushLink flushes both endpoints, progressing both workers: PutSignalNbx can leave
// a signal queued in UCX after its Request completed, and closing a worker with
// operations still queued on an endpoint makes UCX abort. Benchmarks defer it, so it
// runs before the variants' cleanups free what those operations use.
func flushLink(t testing.TB, l *link) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, ep := range []*ucp.Endpoint{l.toR, l.toS} {
		f, err := ep.FlushNbx(nil)
		if err == nil {
			err = waitPoll(ctx, f.Wait, f.Test, func() { l.s.Progress(); l.r.Progress() })
		}
		if err != nil {
			t.Errorf("flush %v: %v", ep, err)
		}
	}
}

var benchForms = []struct {
	name       string
	concurrent bool
}{{"seq", false}, {"2g", true}}

// checkStamps checks that every partition of buf carries iteration it's stamp.
func checkStamps(buf []byte, parts, it int, what string) error {
	size := len(buf) / parts
	for p := range parts {
		if got := buf[p*size]; got != byte(it) {
			return fmt.Errorf("%s iteration %d: partition %d carries stamp %d, want %d", what, it, p, got, byte(it))
		}
	}
	return nil
}

// waitPoll waits with wait, or, with a poll, by testing and polling in turn.
func waitPoll(ctx context.Context, wait func(context.Context) error, test func() (bool, error), poll func()) error {
	if poll == nil {
		return wait(ctx)
	}
	for i := 0; ; i++ {
		if done, err := test(); done {
			return err
		}
		poll()
		if i&1023 == 1023 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
	}
}

// preparedVariant: Start, a stamp and a Pready per partition, Wait.
func preparedVariant(b testing.TB, l *link, parts, size int) *partVariant {
	send, recv, sbuf, rbuf := pair(b, l, parts*size, parts, parts, 0x5042)
	return &partVariant{
		name:      "prepared",
		recvBegin: func(context.Context, int) error { return recv.Start() },
		send: func(ctx context.Context, it int, poll func()) error {
			if err := send.Start(); err != nil {
				return err
			}
			for p := range parts {
				sbuf[p*size] = byte(it)
				if err := send.Pready(p); err != nil {
					return err
				}
			}
			return waitPoll(ctx, send.Wait, send.Test, poll)
		},
		recvEnd: func(ctx context.Context, it int, poll func(), _ bool) error {
			if err := waitPoll(ctx, recv.Wait, recv.Test, poll); err != nil {
				return err
			}
			return checkStamps(rbuf, parts, it, "prepared")
		},
		sender: l.s, receiver: l.r,
	}
}

// registered is a buffer registered with ctx.
func registered(b testing.TB, c *ucp.Context, n int) (*ucp.MemH, []byte) {
	m, err := c.MemAlloc(n)
	require.NoError(b, err)
	b.Cleanup(func() { _ = m.Close() })
	return m, m.Bytes()
}

// workaroundVariant is what partitioned sends take without prepare: one KernelTriggered
// condition per partition, re-armed every iteration with the partition's tag send and
// triggered once the partition is written; the receiver posts one tag receive per
// partition and iteration.
func workaroundVariant(b testing.TB, l *link, parts, size int) *partVariant {
	backend, err := stream.Open(stream.Host)
	require.NoError(b, err)
	smem, sbuf := registered(b, l.ctxS, parts*size)
	rmem, rbuf := registered(b, l.ctxR, parts*size)
	conds := make([]*condition.Condition, parts)
	sparams := make([]ucp.RequestParam, parts)
	for p := range conds {
		conds[p], err = condition.Create(condition.Param{Category: condition.KernelTriggered, Backend: backend})
		require.NoError(b, err)
		sparams[p] = ucp.RequestParam{Condition: conds[p], MemH: smem}
	}
	b.Cleanup(func() {
		for _, c := range conds {
			_ = c.Destroy()
		}
		_ = backend.Close()
	})
	const tagBase = 0x5741_0000
	rparam := &ucp.RequestParam{MemH: rmem}
	sends := make([]*ucp.Request, parts)
	recvs := make([]*ucp.Request, parts)
	handles := make([]condition.DeviceHandle, parts)
	return &partVariant{
		name: "workaround",
		recvBegin: func(_ context.Context, _ int) error {
			for p := range parts {
				r, err := l.r.TagRecvNbx(rbuf[p*size:(p+1)*size], tagBase+uint64(p), ^uint64(0), rparam)
				if err != nil {
					return err
				}
				recvs[p] = r
			}
			return nil
		},
		send: func(ctx context.Context, it int, poll func()) error {
			for p := range parts { // arm every partition's send (what Start would be)
				r, err := l.toR.TagSendNbx(sbuf[p*size:(p+1)*size], tagBase+uint64(p), &sparams[p])
				if err != nil {
					return err
				}
				sends[p] = r
				if handles[p], err = conds[p].DeviceHandle(); err != nil {
					return err
				}
			}
			for p := range parts { // write the partition, trigger its send (Pready)
				sbuf[p*size] = byte(it)
				if err := condition.Trigger(handles[p]); err != nil {
					return err
				}
			}
			for _, r := range sends {
				if err := waitPoll(ctx, r.Wait, r.Test, poll); err != nil {
					return err
				}
			}
			return nil
		},
		recvEnd: func(ctx context.Context, it int, poll func(), _ bool) error {
			for _, r := range recvs {
				if err := waitPoll(ctx, r.Wait, r.Test, poll); err != nil {
					return err
				}
				if r.Length() != size {
					return fmt.Errorf("workaround: received %d bytes, want %d", r.Length(), size)
				}
			}
			return checkStamps(rbuf, parts, it, "workaround")
		},
		sender: l.s, receiver: l.r,
	}
}

// putSignalVariant is the data path alone: the same puts with signals a prepared
// sender issues (each partition into the receiver's buffer, then an add of 1 to the
// partition's signal word), from a tight loop, waited for; the receiver waits until
// every word reached the iteration.
func putSignalVariant(b testing.TB, l *link, parts, size int) *partVariant {
	backend, err := stream.Open(stream.Host)
	require.NoError(b, err)
	b.Cleanup(func() { _ = backend.Close() })
	smem, sbuf := registered(b, l.ctxS, parts*size)
	rmem, rbuf := registered(b, l.ctxR, parts*size)
	words, err := l.r.NewSignals(backend, parts)
	require.NoError(b, err)
	b.Cleanup(func() { _ = words.Close() })
	packed, err := rmem.PackRkey()
	require.NoError(b, err)
	bufKey, err := l.toR.UnpackRkey(packed)
	require.NoError(b, err)
	packed, err = words.PackRkey()
	require.NoError(b, err)
	wordKey, err := l.toR.UnpackRkey(packed)
	require.NoError(b, err)
	b.Cleanup(func() {
		_ = bufKey.Close()
		_ = wordKey.Close()
	})
	param := &ucp.RequestParam{MemH: smem}
	base := uint64(rmem.Address())
	reqs := make([]*ucp.Request, parts)
	return &partVariant{
		name:      "putsignal",
		recvBegin: func(context.Context, int) error { return nil },
		send: func(ctx context.Context, it int, poll func()) error {
			for p := range parts {
				sbuf[p*size] = byte(it)
				// As prepare moves a partition: the iteration stored into its counter.
				sig := ucp.Signal{Op: ucp.SignalStore, Value: uint64(it), Addr: words.Addr(p), Rkey: wordKey}
				r, err := l.toR.PutSignalNbx(sbuf[p*size:(p+1)*size], base+uint64(p*size), bufKey, sig, param)
				if err != nil {
					return err
				}
				reqs[p] = r
			}
			for _, r := range reqs {
				if err := waitPoll(ctx, r.Wait, r.Test, poll); err != nil {
					return err
				}
			}
			return nil
		},
		recvEnd: func(ctx context.Context, it int, poll func(), exact bool) error {
			for i := 0; ; i++ {
				arrived := true
				for p := range parts {
					if words.Word(p).Load() < uint64(it) {
						arrived = false
						break
					}
				}
				if arrived {
					break
				}
				l.r.Progress() // tcp: UCX emulates the puts and adds with active messages
				if poll != nil {
					poll()
				}
				if i&1023 == 1023 {
					if err := ctx.Err(); err != nil {
						return err
					}
				}
			}
			if !exact {
				return nil // the sender, held back by nothing, may be iterations ahead
			}
			return checkStamps(rbuf, parts, it, "putsignal")
		},
		sender: l.s, receiver: l.r,
	}
}

// handshakeVariant is putSignalVariant behind the receiver's readiness, as a
// hand-written protocol that may not overwrite a buffer the receiver still reads must
// run it: the receiver's begin puts the iteration into a word of the sender's, and the
// sender's tight loop starts once that word holds the iteration. It is what a prepared
// iteration does with the matching and bookkeeping taken out; in 2g it is the streaming
// floor under the receiver-readiness rule prepared requests keep (MPI's).
func handshakeVariant(b testing.TB, l *link, parts, size int) *partVariant {
	v := putSignalVariant(b, l, parts, size)
	backend, err := stream.Open(stream.Host)
	require.NoError(b, err)
	b.Cleanup(func() { _ = backend.Close() })
	ready, err := l.s.NewSignals(backend, 1)
	require.NoError(b, err)
	b.Cleanup(func() { _ = ready.Close() })
	packed, err := ready.PackRkey()
	require.NoError(b, err)
	readyKey, err := l.toS.UnpackRkey(packed)
	require.NoError(b, err)
	b.Cleanup(func() { _ = readyKey.Close() })
	srcMem, src := registered(b, l.ctxR, 8)
	param := &ucp.RequestParam{MemH: srcMem}
	var readyReq *ucp.Request
	send := v.send
	v.name = "handshake"
	v.recvBegin = func(ctx context.Context, it int) error {
		if readyReq != nil { // its source is about to be rewritten
			if err := readyReq.Wait(ctx); err != nil {
				return err
			}
		}
		binary.LittleEndian.PutUint64(src, uint64(it))
		readyReq, err = l.toS.PutNbx(src, ready.Addr(0), readyKey, param)
		return err
	}
	v.send = func(ctx context.Context, it int, poll func()) error {
		for i := 0; ready.Word(0).Load() < uint64(it); i++ {
			l.s.Progress()
			if poll != nil {
				poll()
			}
			if i&1023 == 1023 {
				if err := ctx.Err(); err != nil {
					return err
				}
			}
		}
		return send(ctx, it, poll)
	}
	return v
}

// BenchmarkPartitioned64x4K: a prepared iteration of 64 partitions of 4 KiB against
// the workaround of one KernelTriggered condition and one tag send per partition.
// Target: ratio ≤ 1/3 (at least 3× less time).
func BenchmarkPartitioned64x4K(b *testing.B) { benchPartitioned(b, 64, 4<<10, workaroundVariant) }

// BenchmarkPartitioned8x4K: a prepared iteration of 8 partitions of 4 KiB against the
// same 8 PutSignalNbx from a tight loop. Target: ratio ≤ 1.2.
func BenchmarkPartitioned8x4K(b *testing.B) { benchPartitioned(b, 8, 4<<10, putSignalVariant) }

// BenchmarkPartitioned8x4KHandshake: the same prepared iteration against the tight loop
// behind the receiver's readiness (handshakeVariant), the like-for-like reference of
// the 2g form. No target of its own: it tells what of 2g's gap to the bare loop is the
// readiness rule and what is prepare.
func BenchmarkPartitioned8x4KHandshake(b *testing.B) {
	benchPartitioned(b, 8, 4<<10, handshakeVariant)
}

// benchPartitioned compares the prepared variant with ref over every link and form.
func benchPartitioned(b *testing.B, parts, size int, ref func(testing.TB, *link, int, int) *partVariant) {
	for _, ln := range benchLinks {
		for _, f := range benchForms {
			b.Run(ln.name+"/"+f.name, func(b *testing.B) {
				l := ln.make(b)
				defer flushLink(b, l)
				b.SetBytes(int64(parts * size))
				compare(b, preparedVariant(b, l, parts, size), ref(b, l, parts, size), f.concurrent)
			})
		}
	}
}

// The benchmarks' variants move the right bytes, in both forms (a short run, so
// that go test checks them without -bench).
func TestBenchVariants(t *testing.T) {
	l := flushed(shmLink)(t)
	defer flushLink(t, l)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, v := range []*partVariant{
		preparedVariant(t, l, 8, 256), workaroundVariant(t, l, 8, 256), putSignalVariant(t, l, 8, 256),
		handshakeVariant(t, l, 8, 256),
	} {
		for _, f := range benchForms {
			_, err := v.run(ctx, 20, f.concurrent)
			require.NoError(t, err, "%s %s", v.name, f.name)
		}
	}
}

// BenchmarkSignalParts takes a put-with-signal apart: per iteration, 8 partitions of
// 4 KiB as 8 PutSignalNbx (put, fence, add), as 8 puts and 8 adds without the fence,
// as the 8 puts alone (then a flush: remote completion) and as the 8 adds alone; one
// goroutine progressing both workers, each iteration waited for at the receiver.
// What a prepared partition costs beyond its data (docs/performance.md, "Prepared
// partitions").
func BenchmarkSignalParts(b *testing.B) {
	const parts, size = 8, 4 << 10
	for _, ln := range benchLinks {
		for _, kind := range []string{"putsignal", "put+add", "put", "add"} {
			b.Run(ln.name+"/"+kind, func(b *testing.B) {
				l := ln.make(b)
				defer flushLink(b, l)
				backend, err := stream.Open(stream.Host)
				require.NoError(b, err)
				defer backend.Close()
				smem, sbuf := registered(b, l.ctxS, parts*size)
				rmem, _ := registered(b, l.ctxR, parts*size)
				words, err := l.r.NewSignals(backend, parts)
				require.NoError(b, err)
				defer words.Close()
				packed, err := rmem.PackRkey()
				require.NoError(b, err)
				bufKey, err := l.toR.UnpackRkey(packed)
				require.NoError(b, err)
				defer bufKey.Close()
				packed, err = words.PackRkey()
				require.NoError(b, err)
				wordKey, err := l.toR.UnpackRkey(packed)
				require.NoError(b, err)
				defer wordKey.Close()
				param := &ucp.RequestParam{MemH: smem}
				base := uint64(rmem.Address())
				add := ucp.AtomicParam{Op: ucp.AtomicAdd, Operand: 1}
				both := func() { l.s.Progress(); l.r.Progress() }
				ctx := context.Background()
				reqs := make([]*ucp.Request, 0, 2*parts)
				signals := 0
				iteration := func() error {
					reqs = reqs[:0]
					for p := range parts {
						buf, raddr := sbuf[p*size:(p+1)*size], base+uint64(p*size)
						var r1, r2 *ucp.Request
						var err error
						switch kind {
						case "putsignal":
							sig := ucp.Signal{Op: ucp.SignalAdd, Value: 1, Addr: words.Addr(p), Rkey: wordKey}
							r1, err = l.toR.PutSignalNbx(buf, raddr, bufKey, sig, param)
						case "put+add":
							if r1, err = l.toR.PutNbx(buf, raddr, bufKey, param); err == nil {
								r2, err = l.toR.AtomicNbx(add, words.Addr(p), wordKey, nil)
							}
						case "put":
							r1, err = l.toR.PutNbx(buf, raddr, bufKey, param)
						case "add":
							r1, err = l.toR.AtomicNbx(add, words.Addr(p), wordKey, nil)
						}
						if err != nil {
							return err
						}
						for _, r := range []*ucp.Request{r1, r2} {
							if r != nil {
								reqs = append(reqs, r)
							}
						}
					}
					for _, r := range reqs {
						if err := waitPoll(ctx, r.Wait, r.Test, both); err != nil {
							return err
						}
					}
					if kind == "put" {
						f, err := l.toR.FlushNbx(nil)
						if err != nil {
							return err
						}
						return waitPoll(ctx, f.Wait, f.Test, both)
					}
					signals++
					for p := range parts {
						for words.Word(p).Load() < uint64(signals) {
							both()
						}
					}
					return nil
				}
				for range benchWarmup {
					require.NoError(b, iteration())
				}
				b.SetBytes(parts * size)
				b.ResetTimer()
				for range b.N {
					if err := iteration(); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
