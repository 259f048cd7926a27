package main

import (
	"bytes"
	"context"
	"fmt"
	"time"

	"github.com/ucpx/ucpx/prepare"
	"github.com/ucpx/ucpx/stream"
	"github.com/ucpx/ucpx/ucp"
)

// The partitioned tests (`ucpx perf --tests part_lat,part_bw --partitions N`) move each
// message size as one buffer split into N equal partitions, with persistent
// partitioned requests of package prepare, made and prepared (matched with the peer's)
// once per test and size before any iteration is timed:
//
//	part_lat  ping-pong of partitioned iterations: this process Starts its send, makes
//	          every partition ready (Pready), Starts its receive of the answer and waits
//	          for both; the peer waits for the iteration to arrive, then sends it back the
//	          same way. One-way latency is half the round trip, as in tag_lat.
//	part_bw   iterations streamed one way: this process Starts, makes every partition
//	          ready and waits (local completion), then Starts the next at once; each
//	          partition moves as soon as the peer's receive is started for that
//	          iteration, which the peer does as soon as the previous one arrived. Timed
//	          until the peer acknowledges the last one; bytes per second.
//
// Both processes fill their send buffers with the same pattern, so each receiver
// checks the bytes it got after the phase.
const (
	testPartLat = "part_lat"
	testPartBw  = "part_bw"

	defaultPartitions = 8
	maxPartitions     = 1 << 20 // prepare's bound

	// Tags of the partitioned requests (matched by tag and order of init).
	tagPartPing uint64 = 0x7078_0000_0011
	tagPartPong uint64 = 0x7078_0000_0012
	tagPartData uint64 = 0x7078_0000_0013
)

func isPartTest(test string) bool { return test == testPartLat || test == testPartBw }

// needsPart: the context needs what prepared requests use (RMA, 64-bit atomics, active
// messages for the prepare phase).
func (o *perfOptions) needsPart() bool {
	for _, t := range o.tests {
		if isPartTest(t) {
			return true
		}
	}
	return false
}

// checkPartitions validates --partitions against the sizes of the partitioned tests.
func (o *perfOptions) checkPartitions() error {
	if o.partitions < 1 || o.partitions > maxPartitions {
		return fmt.Errorf("--partitions %d: want 1 to %d", o.partitions, maxPartitions)
	}
	if !o.needsPart() {
		return nil
	}
	for _, sz := range o.sizes {
		if sz%o.partitions != 0 {
			return fmt.Errorf("--partitions %d does not divide --sizes %s: for part_lat and part_bw each size is the whole buffer, split into %d equal partitions (use sizes that are multiples of %d)",
				o.partitions, fmtSize(sz), o.partitions, o.partitions)
		}
	}
	return nil
}

// partSet is the prepared requests of one test, size and partition count, kept from
// the warm-up phase to the measured one.
type partSet struct {
	test        string
	size, parts int
	send, recv  *prepare.Request // part_bw: only send on the initiator, only recv on the peer
}

func (ps *partSet) requests() []*prepare.Request {
	var out []*prepare.Request
	for _, r := range []*prepare.Request{ps.send, ps.recv} {
		if r != nil {
			out = append(out, r)
		}
	}
	return out
}

// partRequests returns the prepared requests of test at size in parts partitions,
// making and preparing them (with the peer, which does the same) unless the previous
// phase left them. Both processes make them in the same order, so the prepare phase
// matches them. initiator is `ucpx perf` (the peer is perf-peer).
func (s *perfSide) partRequests(ctx context.Context, test string, size, parts int, initiator bool) (*partSet, error) {
	if ps := s.part; ps != nil && ps.test == test && ps.size == size && ps.parts == parts {
		return ps, nil
	}
	if err := s.freePart(ctx); err != nil {
		return nil, err
	}
	if s.partBackend == nil {
		b, err := stream.Open(stream.Host) // the requests' signal words: host memory
		if err != nil {
			return nil, err
		}
		s.partBackend = b
	}
	sp := prepare.Params{Peer: s.ep, Partitions: parts, MemH: s.smem, Backend: s.partBackend}
	rp := prepare.Params{Peer: s.ep, Partitions: parts, MemH: s.rmem, Backend: s.partBackend}
	sbuf, rbuf := s.smem.Bytes()[:size], s.rmem.Bytes()[:size]
	ps := &partSet{test: test, size: size, parts: parts}
	var err error
	switch {
	case test == testPartLat && initiator:
		sp.Tag, rp.Tag = tagPartPing, tagPartPong
		if ps.send, err = prepare.PsendInit(s.w, sbuf, sp); err == nil {
			ps.recv, err = prepare.PrecvInit(s.w, rbuf, rp)
		}
	case test == testPartLat:
		sp.Tag, rp.Tag = tagPartPong, tagPartPing
		if ps.recv, err = prepare.PrecvInit(s.w, rbuf, rp); err == nil {
			ps.send, err = prepare.PsendInit(s.w, sbuf, sp)
		}
	case test == testPartBw && initiator:
		sp.Tag = tagPartData
		ps.send, err = prepare.PsendInit(s.w, sbuf, sp)
	case test == testPartBw:
		rp.Tag = tagPartData
		ps.recv, err = prepare.PrecvInit(s.w, rbuf, rp)
	default:
		err = fmt.Errorf("not a partitioned test: %q", test)
	}
	s.part = ps // freed by the next freePart, even if incomplete
	if err != nil {
		return nil, err
	}
	// The worker now has prepare's handler for the peer's handshakes (installed by the
	// first PsendInit/PrecvInit; one that arrives before is dropped, so this side must
	// not progress before): from now on waits on the control channel progress it.
	s.progressCtl = true
	if err := prepare.PrepareAll(ctx, ps.requests()...); err != nil {
		return nil, fmt.Errorf("prepare phase: %w", err)
	}
	// This process may now wait on the control channel without progressing: make sure
	// its handshakes have left.
	if err := s.flush(ctx); err != nil {
		return nil, fmt.Errorf("prepare phase: %w", err)
	}
	return ps, nil
}

// freePart frees the prepared requests (after a flush: nothing of theirs in flight).
func (s *perfSide) freePart(ctx context.Context) error {
	ps := s.part
	if ps == nil {
		return nil
	}
	s.part = nil
	err := s.flush(ctx)
	for _, r := range ps.requests() {
		if ferr := r.Free(); ferr != nil && err == nil {
			err = ferr
		}
	}
	if err != nil {
		return fmt.Errorf("free the %s requests: %w", ps.test, err)
	}
	return nil
}

// flush waits until every operation of the endpoint completed at the peer. It also
// sends what PutSignalNbx left queued: a signal may still wait behind its fence when
// the put's Request completed, and goes out only with this process's progress.
func (s *perfSide) flush(ctx context.Context) error {
	f, err := s.ep.FlushNbx(nil)
	if err != nil {
		return err
	}
	return s.wait(ctx, f)
}

// ctlRecv is ctl.recv, but once this side made prepared requests its worker keeps
// progressing while it waits: where UCX emulates the puts and atomics of prepared
// requests with active messages (tcp; shm for memory outside its shared segments), the
// peer's flushes (after the last iteration of a phase, before freeing its requests)
// complete only with this side's progress, and the peer may be waiting for that
// before it answers. Handshakes of the peer's next requests that this progress takes
// in wait in prepare's registry for the requests they match.
func (s *perfSide) ctlRecv(ctx context.Context, ctl *ctlConn, v any, timeout time.Duration) error {
	if !s.progressCtl {
		return ctl.recv(ctx, v, timeout)
	}
	got := make(chan error, 1)
	go func() { got <- ctl.recv(ctx, v, timeout) }()
	for idle := 0; ; {
		select {
		case err := <-got:
			return err
		default:
		}
		if s.w.Progress() > 0 {
			idle = 0
		} else if idle++; idle > 4096 {
			time.Sleep(20 * time.Microsecond) // nothing moves: spare the CPU
		}
	}
}

// waitPart completes the current iteration of r: prepare's Wait, or busy-polling with
// Test when the side spins.
func (s *perfSide) waitPart(ctx context.Context, r *prepare.Request) error {
	var err error
	if s.spin {
		for i := 0; ; i++ {
			var done bool
			if done, err = r.Test(); done {
				break
			}
			if i&1023 == 1023 {
				if err = ctx.Err(); err != nil {
					break
				}
			}
		}
	} else {
		err = r.Wait(ctx)
	}
	if err != nil && ctx.Err() != nil {
		return fmt.Errorf("%w while waiting for the peer", err)
	}
	return err
}

// preadyAll makes every partition of the current iteration ready, one call per
// partition, as an application producing them one by one would.
func preadyAll(r *prepare.Request) error {
	for p := range r.Partitions() {
		if err := r.Pready(p); err != nil {
			return err
		}
	}
	return nil
}

// checkPartData: the receive buffer holds what the peer sent (both fill their send
// buffers with the same pattern).
// Under --check every iteration was checked (and the buffer cleared) already.
func (s *perfSide) checkPartData(size int) error {
	if s.check {
		return nil
	}
	if !bytes.Equal(s.rmem.Bytes()[:size], s.smem.Bytes()[:size]) {
		return fmt.Errorf("received %d bytes differ from what the peer sent", size)
	}
	return nil
}

// checkPart (--check) counts iteration i's wrong bytes once its receive completed,
// before the next one starts, and publishes the progress.
func (s *perfSide) checkPart(size, i int) {
	if i&s.progressMask == 0 {
		s.progress.Store(int64(i))
	}
	if s.check {
		s.checkRecv(s.rmem.Bytes()[:size], s.smem.Bytes()[:size], true)
	}
}

// partLatInitiator: count partitioned round trips, one clock read per iteration (as
// tagLatInitiator). The receive of the answer is started after the partitions were
// made ready, while they are in flight, as tag_lat posts its receive.
func (s *perfSide) partLatInitiator(ctx context.Context, ps *partSet, count int) ([]time.Duration, time.Duration, error) {
	stamps := make([]int64, count+1)
	for i := range count {
		stamps[i] = nanotime()
		if err := ps.send.Start(); err != nil {
			return nil, 0, err
		}
		if err := preadyAll(ps.send); err != nil {
			return nil, 0, err
		}
		if err := ps.recv.Start(); err != nil {
			return nil, 0, err
		}
		if err := s.waitPart(ctx, ps.send); err != nil {
			return nil, 0, err
		}
		if err := s.waitPart(ctx, ps.recv); err != nil {
			return nil, 0, err
		}
		s.checkPart(ps.size, i)
	}
	stamps[count] = nanotime()
	if err := s.checkPartData(ps.size); err != nil {
		return nil, 0, err
	}
	rtts := make([]time.Duration, count)
	for i := range rtts {
		rtts[i] = time.Duration(stamps[i+1] - stamps[i])
	}
	return rtts, time.Duration(stamps[count] - stamps[0]), nil
}

// partLatResponder answers every partitioned iteration with one. Its receive of the
// next iteration is started before it answers (before ready for the first), so the
// initiator's partitions never wait for it.
func (s *perfSide) partLatResponder(ctx context.Context, ready func() error, ps *partSet, count int) error {
	if err := ps.recv.Start(); err != nil {
		return err
	}
	if err := ready(); err != nil {
		return err
	}
	for i := range count {
		if err := s.waitPart(ctx, ps.recv); err != nil {
			return err
		}
		s.checkPart(ps.size, i)
		if err := ps.send.Start(); err != nil {
			return err
		}
		if err := preadyAll(ps.send); err != nil {
			return err
		}
		if i < count-1 {
			if err := ps.recv.Start(); err != nil {
				return err
			}
		}
		if err := s.waitPart(ctx, ps.send); err != nil {
			return err
		}
	}
	if err := s.flush(ctx); err != nil { // the last answer's signals
		return err
	}
	return s.checkPartData(ps.size)
}

// partBwSender streams count partitioned iterations and waits for the receiver's
// acknowledgement of the last.
func (s *perfSide) partBwSender(ctx context.Context, ps *partSet, count int) (time.Duration, error) {
	ack, err := s.w.TagRecvNbx(s.small[:8], tagAck, fullMask, nil)
	if err != nil {
		return 0, err
	}
	start := time.Now()
	for i := range count {
		if i&s.progressMask == 0 {
			s.progress.Store(int64(i))
		}
		if err := ps.send.Start(); err != nil {
			return 0, err
		}
		if err := preadyAll(ps.send); err != nil {
			return 0, err
		}
		if err := s.waitPart(ctx, ps.send); err != nil {
			return 0, err
		}
	}
	if err := s.wait(ctx, ack); err != nil {
		return 0, fmt.Errorf("acknowledgement: %w", err)
	}
	return time.Since(start), nil
}

// partBwReceiver starts each iteration as soon as the previous one arrived and
// acknowledges the last.
func (s *perfSide) partBwReceiver(ctx context.Context, ready func() error, ps *partSet, count int) error {
	if err := ps.recv.Start(); err != nil {
		return err
	}
	if err := ready(); err != nil {
		return err
	}
	for i := range count {
		if err := s.waitPart(ctx, ps.recv); err != nil {
			return err
		}
		s.checkPart(ps.size, i)
		if i < count-1 {
			if err := ps.recv.Start(); err != nil {
				return err
			}
		}
	}
	if err := s.checkPartData(ps.size); err != nil {
		return err
	}
	sr, err := s.ep.TagSendNbx(s.small[:8], tagAck, nil)
	if err != nil {
		return err
	}
	return s.wait(ctx, sr)
}

// partPhaseSetup is the initiator's part of a partitioned phase before the peer says
// ready: make and prepare the requests (the peer does the same meanwhile), clear the
// receive buffer for the check after the phase.
func (s *perfSide) partPhaseSetup(ctx context.Context, test string, size, parts int) (*partSet, error) {
	ps, err := s.partRequests(ctx, test, size, parts, true)
	if err != nil {
		return nil, err
	}
	clear(s.rmem.Bytes()[:size])
	return ps, nil
}

// respondPart runs the peer's side of a partitioned phase.
func (s *perfSide) respondPart(ctx context.Context, ready func() error, test string, size, parts, count int) error {
	if parts < 1 || parts > maxPartitions || size%parts != 0 {
		return fmt.Errorf("bad phase: %d partitions of %d bytes", parts, size)
	}
	ps, err := s.partRequests(ctx, test, size, parts, false)
	if err != nil {
		return err
	}
	clear(s.rmem.Bytes()[:size])
	if test == testPartLat {
		return s.partLatResponder(ctx, ready, ps, count)
	}
	return s.partBwReceiver(ctx, ready, ps, count)
}

// partFeatures are the context features the partitioned tests add.
const partFeatures = ucp.FeatureRMA | ucp.FeatureAMO64 | ucp.FeatureAM
