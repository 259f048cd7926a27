package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"math/rand"
	"os"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/ucpx/ucpx/stream"
	"github.com/ucpx/ucpx/ucp"
)

// Tags of the perf tests; tests run one after another, so fixed tags suffice.
const (
	tagPing  uint64 = 0x7078_0000_0001
	tagPong  uint64 = 0x7078_0000_0002
	tagData  uint64 = 0x7078_0000_0003
	tagAck   uint64 = 0x7078_0000_0004
	tagDone  uint64 = 0x7078_0000_0005
	fullMask        = ^uint64(0)
)

// Fault injection for tests, read by perf-peer: perfPeerCrashEnv names a test in which
// it exits abruptly once the phase has started; perfPeerStallEnv a test/size
// ("tag_lat/4096") whose phase it never gets ready for; perfPeerCorruptEnv a test
// (tag_lat) in one of whose phases' answers it flips one byte.
const (
	perfPeerCrashEnv   = "UCPX_PERF_PEER_CRASH_IN"
	perfPeerStallEnv   = "UCPX_PERF_PEER_STALL_AT"
	perfPeerCorruptEnv = "UCPX_PERF_PEER_CORRUPT"
)

// clockBase anchors nanotime.
var clockBase = time.Now()

// nanotime reads the monotonic clock once: time.Since of a time with a monotonic
// reading is one vDSO read, where time.Now makes two (wall and monotonic), whose cost
// would otherwise be a visible part of an 8-byte round trip. ucx_perftest likewise
// reads a cheap clock (the TSC) once per iteration. No go:linkname into the runtime.
func nanotime() int64 { return int64(time.Since(clockBase)) }

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// perfSide is one process's half of `ucpx perf`: a context restricted to the
// features the tests use (like ucx_perftest), one worker without wakeup (both sides
// busy-poll, as ucx_perftest does), one endpoint to the peer, and two registered
// buffers of the largest size. The peer's receive buffer is also the put target.
type perfSide struct {
	ctx     *ucp.Context
	w       *ucp.Worker
	ep      *ucp.Endpoint
	smem    *ucp.MemH // send buffer, filled with a pattern
	rmem    *ucp.MemH // receive buffer / put target
	rkey    *ucp.Rkey // the peer's rmem (initiator only)
	peerErr bool
	spin    bool // busy-poll with Request.Test instead of Request.Wait
	// ring: the operations in flight of a bandwidth test's window, each tracked in
	// its slot's request of reqs (caller-owned, reused: the loops allocate nothing).
	ring  []*ucp.Request
	reqs  []ucp.Request
	small []byte   // acks and put-completion notices
	rig   *modeRig // the stream machinery of --modes (initiator only)
	// part_lat, part_bw: the prepared requests of the current test and size, and the
	// host backend of their signal words.
	part        *partSet
	partBackend stream.Backend
	// progressCtl: progress the worker while waiting for a control message (see
	// ctlRecv); set once this side made its first prepared request.
	progressCtl bool
	// check: count received bytes that differ from what was sent into wrong (--check).
	check bool
	wrong atomic.Int64
	// progress: iterations of the current phase done, published when the iteration
	// number has no bit of progressMask set (the progress line reads it from another
	// goroutine).
	progress     atomic.Int64
	progressMask int
	expect       []byte // the peer's expected ping of a +work mode (--check)
}

// progressMaskFor is the progress mask of a phase of messages of size: below 64 KiB
// the loops publish their count every 64 iterations (an atomic store each iteration
// would be a visible part of an 8-byte round trip, and 64 such iterations take
// milliseconds); from 64 KiB every iteration (it moves that much, beside which the
// store is nothing, and one iteration of a large size can take seconds: the progress
// line must not say 0 done while iterations complete).
func progressMaskFor(size int) int {
	if size >= 64<<10 {
		return 0
	}
	return 64 - 1
}

func newPerfSide(tls string, peerErr, rma, part, spin bool, size, window int) (*perfSide, error) {
	features := ucp.FeatureTag
	if rma {
		features |= ucp.FeatureRMA
	}
	if part {
		features |= partFeatures
	}
	c, err := ucp.NewContext(ucp.ContextParams{
		Features: features,
		Config:   map[string]string{"TLS": tls},
	})
	if err != nil {
		return nil, fmt.Errorf("UCX context with UCX_TLS=%s: %w", tls, err)
	}
	s := &perfSide{ctx: c, peerErr: peerErr, spin: spin, ring: make([]*ucp.Request, window), reqs: make([]ucp.Request, window), small: make([]byte, 16)}
	if s.w, err = c.NewWorker(ucp.WorkerParams{NoWakeup: true}); err != nil {
		s.close()
		return nil, err
	}
	if s.smem, err = c.MemAlloc(size); err != nil {
		s.close()
		return nil, fmt.Errorf("register %d-byte send buffer: %w", size, err)
	}
	if s.rmem, err = c.MemAlloc(size); err != nil {
		s.close()
		return nil, fmt.Errorf("register %d-byte receive buffer: %w", size, err)
	}
	rand.New(rand.NewSource(1)).Read(s.smem.Bytes())
	return s, nil
}

// connect creates the endpoint to the peer's worker address and, on the initiator,
// unpacks the peer's rkey.
func (s *perfSide) connect(addr, rkey []byte) error {
	ep, err := s.w.ConnectAddress(addr, &ucp.EndpointParams{NoPeerErrorHandling: !s.peerErr})
	if err != nil {
		return fmt.Errorf("connect to the peer's worker: %w", err)
	}
	s.ep = ep
	if rkey != nil {
		if s.rkey, err = ep.UnpackRkey(rkey); err != nil {
			return fmt.Errorf("unpack the peer's rkey: %w", err)
		}
	}
	return nil
}

func (s *perfSide) close() {
	if s.rig != nil {
		s.rig.close() // its registrations go before the UCX context
	}
	if s.ctx != nil {
		_ = s.ctx.Close() // closes the rkey, endpoint, worker and registrations
	}
	if s.partBackend != nil {
		_ = s.partBackend.Close()
	}
}

// spinWait drives progress until r completes without ever parking: the responder of
// a one-sided test must keep progressing (RMA over tcp needs it), as ucx_perftest's
// responder does.
func spinWait(ctx context.Context, r *ucp.Request) error {
	for i := 0; ; i++ {
		if done, err := r.Test(); done {
			return err
		}
		if i&1023 == 1023 {
			if err := ctx.Err(); err != nil {
				return fmt.Errorf("%w while waiting for the peer", err)
			}
		}
	}
}

// wait completes r with Request.Wait (spin, then park), or by busy-polling when the
// side was made with spin.
func (s *perfSide) wait(ctx context.Context, r *ucp.Request) error {
	if r.Done() {
		return r.Err()
	}
	if s.spin {
		return spinWait(ctx, r)
	}
	if err := r.Wait(ctx); err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("%w while waiting for the peer", err)
		}
		return err
	}
	return nil
}

func checkLen(r *ucp.Request, want int) error { return wantLen(r.Length(), want) }

func wantLen(n, want int) error {
	if n != want {
		return fmt.Errorf("received %d bytes, want %d", n, want)
	}
	return nil
}

// drainRing waits for every request still in the window.
func (s *perfSide) drainRing(ctx context.Context) error {
	var first error
	for i, r := range s.ring {
		if r != nil {
			if err := s.wait(ctx, r); err != nil && first == nil {
				first = err
			}
			s.ring[i] = nil
		}
	}
	return first
}

// waitErr marks an error of a wait that ended because ctx did.
func waitErr(ctx context.Context, err error) error {
	if err != nil && ctx.Err() != nil {
		return fmt.Errorf("%w while waiting for the peer", err)
	}
	return err
}

// tagLatInitiator: ping-pong, timing each round trip. As in ucx_perftest, each
// iteration sends the ping, then posts the receive for the pong: posting it while the
// ping is in flight keeps it off the critical path, and the pong cannot overtake it.
// One clock read per iteration: round trip i is the time between the starts of
// iterations i and i+1.
//
// An iteration is one fused call (Endpoint.TagSendRecv: both posts and the wait in one
// cgo call, nothing allocated). --wait spin keeps the nbx path: it asks for polling
// with Request.Test, which the fused calls do not do. The fused calls take no memory
// handle; UCX looks the registered buffers up itself where a protocol needs one.
func (s *perfSide) tagLatInitiator(ctx context.Context, size, count int) ([]time.Duration, time.Duration, error) {
	if s.spin {
		return s.tagLatInitiatorNbx(ctx, size, count)
	}
	sbuf, rbuf := s.smem.Bytes()[:size], s.rmem.Bytes()[:size]
	stamps := make([]int64, count+1)
	for i := 0; i < count; i++ {
		stamps[i] = nanotime()
		if i&s.progressMask == 0 {
			s.progress.Store(int64(i))
		}
		n, _, err := s.ep.TagSendRecv(ctx, sbuf, tagPing, rbuf, tagPong, fullMask)
		if err != nil {
			return nil, 0, waitErr(ctx, err)
		}
		if err := wantLen(n, size); err != nil {
			return nil, 0, err
		}
		if s.check {
			s.checkRecv(rbuf, sbuf, true) // the peer's pong holds what our ping held
		}
	}
	stamps[count] = nanotime()
	return roundTrips(stamps)
}

// roundTrips turns the start times of count iterations and the end time into round
// trips and the total.
func roundTrips(stamps []int64) ([]time.Duration, time.Duration, error) {
	count := len(stamps) - 1
	rtts := make([]time.Duration, count)
	for i := range rtts {
		rtts[i] = time.Duration(stamps[i+1] - stamps[i])
	}
	return rtts, time.Duration(stamps[count] - stamps[0]), nil
}

// tagLatInitiatorNbx is tagLatInitiator with nbx calls and waits of the side's kind.
func (s *perfSide) tagLatInitiatorNbx(ctx context.Context, size, count int) ([]time.Duration, time.Duration, error) {
	sbuf, rbuf := s.smem.Bytes()[:size], s.rmem.Bytes()[:size]
	sp := &ucp.RequestParam{MemH: s.smem}
	rp := &ucp.RequestParam{MemH: s.rmem}
	stamps := make([]int64, count+1)
	for i := 0; i < count; i++ {
		stamps[i] = nanotime()
		if i&s.progressMask == 0 {
			s.progress.Store(int64(i))
		}
		sr, err := s.ep.TagSendNbx(sbuf, tagPing, sp)
		if err != nil {
			return nil, 0, err
		}
		rr, err := s.w.TagRecvNbx(rbuf, tagPong, fullMask, rp)
		if err != nil {
			return nil, 0, err
		}
		if err := s.wait(ctx, rr); err != nil {
			return nil, 0, err
		}
		if err := s.wait(ctx, sr); err != nil {
			return nil, 0, err
		}
		if rr.Length() != size {
			return nil, 0, checkLen(rr, size)
		}
		if s.check {
			s.checkRecv(rbuf, sbuf, true) // the peer's pong holds what our ping held
		}
	}
	stamps[count] = nanotime()
	return roundTrips(stamps)
}

// corruptAt is the iteration of a tag_lat phase of count whose pong gets one wrong
// byte (fault injection for tests), or -1.
func corruptAt(count int) int {
	if os.Getenv(perfPeerCorruptEnv) == testTagLat {
		return count / 2
	}
	return -1
}

// tagLatResponder answers every ping with a pong: a fused receive of the first ping,
// then per iteration one fused call that sends pong i and receives ping i+1 (the
// receive is posted right after the pong, long before that ping can arrive), and the
// last pong alone. --wait spin keeps the nbx path, as tagLatInitiator does.
func (s *perfSide) tagLatResponder(ctx context.Context, ready func() error, mode string, size, count int) error {
	if s.spin {
		return s.tagLatResponderNbx(ctx, ready, mode, size, count)
	}
	sbuf, rbuf := s.smem.Bytes()[:size], s.rmem.Bytes()[:size]
	bad := corruptAt(count)
	if err := ready(); err != nil {
		return err
	}
	n, _, err := s.w.TagRecv(ctx, rbuf, tagPing, fullMask)
	for i := 0; err == nil; i++ {
		if err := wantLen(n, size); err != nil {
			return err
		}
		if s.check {
			s.checkRecv(rbuf, s.expectedPing(mode, size, i), true)
		}
		if i == bad {
			sbuf[size/2] ^= 0x5a
		}
		last := i == count-1
		if last {
			err = s.ep.TagSend(ctx, sbuf, tagPong)
		} else {
			n, _, err = s.ep.TagSendRecv(ctx, sbuf, tagPong, rbuf, tagPing, fullMask)
		}
		if i == bad {
			sbuf[size/2] ^= 0x5a
		}
		if last {
			break
		}
	}
	return waitErr(ctx, err)
}

// tagLatResponderNbx is tagLatResponder with nbx calls and waits of the side's kind.
func (s *perfSide) tagLatResponderNbx(ctx context.Context, ready func() error, mode string, size, count int) error {
	sbuf, rbuf := s.smem.Bytes()[:size], s.rmem.Bytes()[:size]
	bad := corruptAt(count)
	sp := &ucp.RequestParam{MemH: s.smem}
	rp := &ucp.RequestParam{MemH: s.rmem}
	rr, err := s.w.TagRecvNbx(rbuf, tagPing, fullMask, rp)
	if err != nil {
		return err
	}
	if err := ready(); err != nil {
		return err
	}
	for i := 0; i < count; i++ {
		if i > 0 {
			if rr, err = s.w.TagRecvNbx(rbuf, tagPing, fullMask, rp); err != nil {
				return err
			}
		}
		if err := s.wait(ctx, rr); err != nil {
			return err
		}
		if err := checkLen(rr, size); err != nil {
			return err
		}
		if s.check {
			s.checkRecv(rbuf, s.expectedPing(mode, size, i), true)
		}
		if i == bad {
			sbuf[size/2] ^= 0x5a
		}
		sr, err := s.ep.TagSendNbx(sbuf, tagPong, sp)
		if err != nil {
			return err
		}
		err = s.wait(ctx, sr)
		if i == bad {
			sbuf[size/2] ^= 0x5a
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// tagBwSender streams count tag sends back to back with at most len(ring) in flight,
// then waits for the receiver's acknowledgement (ucx_perftest's tag_bw: a window of
// sends, a new one as soon as the oldest completed).
func (s *perfSide) tagBwSender(ctx context.Context, size, count int) (time.Duration, error) {
	sbuf := s.smem.Bytes()[:size]
	sp := &ucp.RequestParam{MemH: s.smem, Flags: ucp.MultiSend}
	ack, err := s.w.TagRecvNbx(s.small[:8], tagAck, fullMask, nil)
	if err != nil {
		return 0, err
	}
	start := time.Now()
	for i := 0; i < count; i++ {
		if i&s.progressMask == 0 {
			s.progress.Store(int64(i))
		}
		slot := i % len(s.ring)
		if r := s.ring[slot]; r != nil {
			if err := s.wait(ctx, r); err != nil {
				return 0, err
			}
		}
		sp.Request = &s.reqs[slot]
		if s.ring[slot], err = s.ep.TagSendNbx(sbuf, tagData, sp); err != nil {
			return 0, err
		}
	}
	if err := s.drainRing(ctx); err != nil {
		return 0, err
	}
	if err := s.wait(ctx, ack); err != nil {
		return 0, fmt.Errorf("acknowledgement: %w", err)
	}
	return time.Since(start), nil
}

// tagBwReceiver keeps len(ring) receives posted and acknowledges the last message.
func (s *perfSide) tagBwReceiver(ctx context.Context, ready func() error, size, count int) error {
	rbuf := s.rmem.Bytes()[:size]
	rp := &ucp.RequestParam{MemH: s.rmem, Flags: ucp.MultiSend}
	W := len(s.ring)
	posted := 0
	var err error
	for ; posted < min(W, count); posted++ {
		rp.Request = &s.reqs[posted]
		if s.ring[posted], err = s.w.TagRecvNbx(rbuf, tagData, fullMask, rp); err != nil {
			return err
		}
	}
	if err := ready(); err != nil {
		return err
	}
	for c := 0; c < count; c++ {
		slot := c % W
		r := s.ring[slot]
		s.ring[slot] = nil
		if err := s.wait(ctx, r); err != nil {
			return err
		}
		if err := checkLen(r, size); err != nil {
			return err
		}
		if s.check {
			// Not cleared: the other receives of the window land in the same buffer.
			s.checkRecv(rbuf, s.smem.Bytes()[:size], false)
		}
		if posted < count {
			rp.Request = &s.reqs[slot]
			if s.ring[slot], err = s.w.TagRecvNbx(rbuf, tagData, fullMask, rp); err != nil {
				return err
			}
			posted++
		}
	}
	sr, err := s.ep.TagSendNbx(s.small[:8], tagAck, nil)
	if err != nil {
		return err
	}
	return s.wait(ctx, sr)
}

// putBwSender writes count puts of size into the peer's buffer with at most
// len(ring) in flight, then flushes the endpoint (remote completion); that ends the
// measurement, as in ucx_perftest's ucp_put_bw. A tagged notice with the data's
// checksum then lets the responder verify the buffer.
func (s *perfSide) putBwSender(ctx context.Context, size, count int) (time.Duration, error) {
	if s.rkey == nil {
		return 0, fmt.Errorf("no rkey for the peer's memory")
	}
	sbuf := s.smem.Bytes()[:size]
	sp := &ucp.RequestParam{MemH: s.smem, Flags: ucp.MultiSend}
	raddr := s.rkey.Base()
	var err error
	start := time.Now()
	for i := 0; i < count; i++ {
		if i&s.progressMask == 0 {
			s.progress.Store(int64(i))
		}
		slot := i % len(s.ring)
		if r := s.ring[slot]; r != nil {
			if err := s.wait(ctx, r); err != nil {
				return 0, err
			}
		}
		sp.Request = &s.reqs[slot]
		if s.ring[slot], err = s.ep.PutNbx(sbuf, raddr, s.rkey, sp); err != nil {
			return 0, err
		}
	}
	if err := s.drainRing(ctx); err != nil {
		return 0, err
	}
	f, err := s.ep.FlushNbx(nil)
	if err != nil {
		return 0, err
	}
	if err := s.wait(ctx, f); err != nil {
		return 0, fmt.Errorf("flush: %w", err)
	}
	elapsed := time.Since(start)

	notice := s.small[:8]
	binary.LittleEndian.PutUint32(notice, crc32.Checksum(sbuf, castagnoli))
	binary.LittleEndian.PutUint32(notice[4:], uint32(size))
	sr, err := s.ep.TagSendNbx(notice, tagDone, nil)
	if err != nil {
		return 0, err
	}
	return elapsed, s.wait(ctx, sr)
}

// putBwResponder progresses (for transports whose RMA needs the target's progress)
// until the initiator's completion notice arrives, then verifies the buffer.
func (s *perfSide) putBwResponder(ctx context.Context, ready func() error, size int) error {
	notice := s.small[:8]
	rr, err := s.w.TagRecvNbx(notice, tagDone, fullMask, nil)
	if err != nil {
		return err
	}
	if s.check {
		clear(s.rmem.Bytes()[:size]) // what the puts did not write shows as wrong
	}
	if err := ready(); err != nil {
		return err
	}
	if err := spinWait(ctx, rr); err != nil {
		return err
	}
	want, n := binary.LittleEndian.Uint32(notice), int(binary.LittleEndian.Uint32(notice[4:]))
	if n != size {
		return fmt.Errorf("completion notice for %d bytes, want %d", n, size)
	}
	if s.check {
		// Every byte the puts wrote; counted instead of failing on the checksum.
		s.checkRecv(s.rmem.Bytes()[:size], s.smem.Bytes()[:size], false)
		return nil
	}
	if got := crc32.Checksum(s.rmem.Bytes()[:size], castagnoli); got != want {
		return fmt.Errorf("put data checksum %08x, initiator sent %08x", got, want)
	}
	return nil
}

// respond runs the peer's side of one phase (m.Parts: partitions of part_lat,
// part_bw; m.Mode: how the initiator drives tag_lat) and says done, with the wrong
// bytes it received under --check.
func (s *perfSide) respond(ctx context.Context, ctl *ctlConn, m perfMsg) error {
	test, size, count, parts := m.Test, m.Size, m.Count, m.Parts
	if size > s.rmem.Len() || count <= 0 || count > maxIters {
		return fmt.Errorf("bad phase: size %d (buffer %d), count %d", size, s.rmem.Len(), count)
	}
	s.wrong.Store(0)
	s.progressMask = progressMaskFor(size)
	if os.Getenv(perfPeerStallEnv) == test+"/"+strconv.Itoa(size) {
		// Fault injection for tests: never get ready, as a hung peer would not.
		<-ctx.Done()
		return context.Cause(ctx)
	}
	ready := func() error {
		err := ctl.send(perfMsg{Op: "ready"}, ctlTimeout)
		if crash := os.Getenv(perfPeerCrashEnv); crash != "" && crash == test {
			// Fault injection for tests: die in the middle of a phase.
			fmt.Fprintf(os.Stderr, "ucpx perf-peer: %s=%s: exiting abruptly\n", perfPeerCrashEnv, crash)
			os.Exit(7)
		}
		return err
	}
	var err error
	switch test {
	case testTagLat:
		err = s.tagLatResponder(ctx, ready, m.Mode, size, count)
	case testTagBw:
		err = s.tagBwReceiver(ctx, ready, size, count)
	case testPutBw:
		err = s.putBwResponder(ctx, ready, size)
	case testPartLat, testPartBw:
		err = s.respondPart(ctx, ready, test, size, parts, count)
	default:
		err = fmt.Errorf("unknown test %q", test)
	}
	if err != nil {
		return err
	}
	return ctl.send(perfMsg{Op: "done", Wrong: s.wrong.Load()}, ctlTimeout)
}
