package ucp

import (
	"bytes"
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/internal/testenv/fakeipc"
)

// controlLog records the control messages (RevokeAM) a worker's handler takes, as the
// bytes that came, and counts those it finished.
type controlLog struct {
	w       *Worker
	mu      sync.Mutex
	headers [][]byte
	done    int
}

func logControl(w *Worker) *controlLog {
	l := &controlLog{w: w}
	w.mu.Lock()
	h := w.am[RevokeAM]
	fn := h.fn
	h.fn = func(m *AmMessage) {
		l.mu.Lock()
		l.headers = append(l.headers, append([]byte(nil), m.Header...))
		l.mu.Unlock()
		fn(m)
		l.mu.Lock()
		l.done++
		l.mu.Unlock()
	}
	w.mu.Unlock()
	return l
}

func (l *controlLog) handled() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.done
}

// last is the newest message of type typ from sender.
func (l *controlLog) last(t *testing.T, sender *Context, typ byte) []byte {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := len(l.headers) - 1; i >= 0; i-- {
		from, ty, _, err := decodeControl(l.w.ctx.trust.seal, l.headers[i])
		if err == nil && ty == typ && from == sender.trust.id {
			return l.headers[i]
		}
	}
	t.Fatalf("no control message of type %d from %x", typ, sender.trust.id[:8])
	return nil
}

func (l *controlLog) count(typ byte) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, h := range l.headers {
		if _, ty, _, err := decodeControl(l.w.ctx.trust.seal, h); err == nil && ty == typ {
			n++
		}
	}
	return n
}

// replay sends the bytes of a control message again on ep, as a peer or a forwarder
// that repeats what it saw would, and waits until the receiver's log handled it.
func replay(t *testing.T, ep *Endpoint, h []byte, at *controlLog) {
	t.Helper()
	n := at.handled()
	w := ep.w
	h = bytes.Clone(h)
	w.mu.Lock()
	ptr := w.raw.AmSend(ep.raw, RevokeAM, bufPtr(h), len(h), nil, 0, 0, 0, -1, nil)
	_, _ = w.postLocked("am_send_nbx", ptr, &defaultParam, nil, bufPtr(h))
	w.mu.Unlock()
	require.Eventually(t, func() bool { return at.handled() > n }, 10*time.Second, time.Millisecond)
}

// importerCount is what m's exporter counts of importer's keys; -1 if it has no
// record of it.
func importerCount(m *MemH, importer *Context) int {
	m.ctx.mu.Lock()
	defer m.ctx.mu.Unlock()
	if imp := m.importers[importer.trust.id]; imp != nil {
		return imp.count
	}
	return -1
}

func revokeByMessage(t *testing.T) {
	old := revokeInProcess
	revokeInProcess = false
	t.Cleanup(func() { revokeInProcess = old })
}

// replayScene logs the control messages B receives, progresses both workers in the
// background (stopB, stopA end it), and exports a region m of B, packed.
func replayScene(t *testing.T, p *pair) (at *controlLog, stopB, stopA func(), m *MemH, packed []byte) {
	at = logControl(p.b)
	stopB, stopA = background(p.b), background(p.a)
	m, err := p.ctxB.MemAlloc(4096)
	require.NoError(t, err)
	packed, err = m.PackRkey()
	require.NoError(t, err)
	return at, stopB, stopA, m, packed
}

// A release notice sent again (replayed, duplicated) does not count as a second
// release: the exporter still waits for the importer's other key, which Close
// revokes. Before, the exporter forgot the importer, MemH.Close freed the memory at
// once, and the importer's remaining key still wrote into it.
func TestRevokeReplayedReleaseKeepsImporter(t *testing.T) {
	revokeByMessage(t)
	pairs(t, func(t *testing.T, p *pair) {
		at, stopB, stopA, m, packed := replayScene(t, p)
		rk1, err := p.epA.UnpackRkey(packed)
		require.NoError(t, err)
		rk2, err := p.epA.UnpackRkey(packed)
		require.NoError(t, err)
		waitImported(t, m, p.ctxA, 2)
		require.NoError(t, rk1.Close())
		waitImported(t, m, p.ctxA, 1)

		replay(t, p.epA, at.last(t, p.ctxA, ctlRelease), at)
		require.Equal(t, 1, importerCount(m, p.ctxA), "the replayed release counted")

		require.NoError(t, m.Close()) // revokes rk2 (A progresses)
		stopA()
		stopB()
		_, err = p.epA.PutNbx([]byte{1}, rk2.Base(), rk2, nil)
		require.ErrorIs(t, err, ErrRevoked, "the importer's key works after its region was freed")
		require.NoError(t, rk2.Close())
	})
}

// An import notice sent again after the importer closed its key does not make the
// exporter wait for an importer that holds nothing: Close returns at once, even while
// the importer is silent. Before, the replay counted as a key, and Close timed out
// (the memory stayed registered).
func TestRevokeReplayedImportAfterReleaseIgnored(t *testing.T) {
	revokeByMessage(t)
	pairs(t, func(t *testing.T, p *pair) {
		at, stopB, stopA, m, packed := replayScene(t, p)
		p.ctxB.revokeTimeout = 200 * time.Millisecond
		rk, err := p.epA.UnpackRkey(packed)
		require.NoError(t, err)
		waitImported(t, m, p.ctxA, 1)
		require.NoError(t, rk.Close())
		require.Eventually(t, func() bool { return importerCount(m, p.ctxA) <= 0 }, 10*time.Second, time.Millisecond)

		replay(t, p.epA, at.last(t, p.ctxA, ctlImport), at)
		stopA() // the importer no longer answers
		stopB()
		require.Less(t, importerCount(m, p.ctxA), 1, "the replayed import counted")
		require.NoError(t, m.Close(), "waited for an importer that holds no key")
	})
}

// A revocation that comes again while the importer still revokes (replayed, or sent
// twice) is acknowledged only once the running one ended: the importer's copy into
// the region is done and the region unmapped before the exporter hears of it. Before,
// the second revocation found nothing left to revoke and acknowledged at once, and
// MemH.Close returned (the exporter then freed the memory) with the copy still to run.
func TestRevokeAgainWaitsForRunningRevocation(t *testing.T) {
	revokeByMessage(t)
	p, dev := ipcPair(t) // B progresses in the background
	const n = 64 << 10
	alloc := fakeipc.Malloc(n)
	t.Cleanup(alloc.Free) // after the stream's cleanup, which runs the copy
	atA, atB := logControl(p.a), logControl(p.b)
	marker := make(chan struct{}, 1)
	require.NoError(t, p.b.SetAmHandler(9, func(*AmMessage) { marker <- struct{}{} }))
	t.Cleanup(background(p.a))
	m, packed := deviceRegion(t, p.ctxB, alloc, 0, n)
	rk, err := p.epA.UnpackRkey(packed)
	require.NoError(t, err)
	waitImported(t, m, p.ctxA, 1)

	// A copy into the region waits on its stream: the revocation's flush waits for it.
	s, sc := streamCondition(t, dev)
	gate := make(chan struct{})
	var open sync.Once
	t.Cleanup(func() { open.Do(func() { close(gate) }) })
	require.NoError(t, s.LaunchHostFunc(func() { <-gate }))
	put, err := p.epA.PutNbx(pattern(n, 2), rk.Base(), rk, &RequestParam{Condition: sc})
	require.NoError(t, err)

	closed := make(chan error, 1)
	go func() { closed <- m.Close() }()
	require.Eventually(t, func() bool { return atA.handled() == 1 }, 10*time.Second, time.Millisecond)
	replay(t, p.epB, atA.last(t, p.ctxB, ctlRevoke), atA)
	// Whatever A sent before this marker, B has taken when the marker arrives.
	_, err = p.epA.AmSendNbx(9, nil, nil, nil)
	require.NoError(t, err)
	<-marker
	require.Zero(t, atB.count(ctlAck), "acknowledged while the importer's copy into the region was pending")
	select {
	case err := <-closed:
		t.Fatalf("MemH.Close returned (%v) while the importer's copy into the region was pending", err)
	default:
	}

	open.Do(func() { close(gate) })
	require.NoError(t, <-closed)
	require.Zero(t, fakeipc.Mapped(alloc.Ptr()), "mapped after the exporter's Close returned")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, put.Wait(ctx), "the copy issued before the revocation completes")
	require.Equal(t, checksum(pattern(n, 2)), checksum(alloc.Bytes()))
	require.NoError(t, rk.Close())
}

// An acknowledgement covers the keys its importer had when the revocation reached it,
// not one unpacked later (from a packed key of the region being closed): an old
// acknowledgement sent again after such an import does not settle the importer, and
// Close waits for it until it revoked the new key. Before, the first acknowledgement
// settled the importer for good (replayed or not), and Close returned with the new
// key still working.
func TestRevokeOldAckDoesNotCoverNewImport(t *testing.T) {
	revokeByMessage(t)
	worker := func() (*Context, *Worker) {
		c, err := NewContext(ContextParams{})
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		w, err := c.NewWorker(WorkerParams{})
		require.NoError(t, err)
		return c, w
	}
	// link connects a and b both ways over shared memory; it returns a's endpoint.
	link := func(a, b *Worker) *Endpoint {
		addrA, err := a.Address()
		require.NoError(t, err)
		addrB, err := b.Address()
		require.NoError(t, err)
		shm := &EndpointParams{NoPeerErrorHandling: true}
		ab, err := a.ConnectAddress(addrB, shm)
		require.NoError(t, err)
		_, err = b.ConnectAddress(addrA, shm)
		require.NoError(t, err)
		return ab
	}
	ce, e := worker()  // the exporter
	cp, pw := worker() // an importer that acknowledges, then unpacks again
	cq, qw := worker() // an importer silent at first
	epP, epQ := link(pw, e), link(qw, e)
	atE := logControl(e)
	stopE := background(e)
	defer stopE()
	m, err := ce.MemAlloc(4096)
	require.NoError(t, err)
	ce.revokeTimeout = 200 * time.Millisecond
	packed, err := m.PackRkey()
	require.NoError(t, err)
	rkP, err := epP.UnpackRkey(packed)
	require.NoError(t, err)
	rkQ, err := epQ.UnpackRkey(packed)
	require.NoError(t, err)
	waitImported(t, m, cp, 1)
	waitImported(t, m, cq, 1)
	nameP := (&importer{peer: cp.trust.id}).String()

	stopP := background(pw)
	err = m.Close() // p acknowledges, q does not
	stopP()
	require.ErrorIs(t, err, ErrTimedOut)
	require.NotContains(t, err.Error(), nameP)
	oldAck := atE.last(t, cp, ctlAck)

	// p unpacks the key again; it answers nothing from now on.
	n := atE.handled()
	rkP2, err := epP.UnpackRkey(packed)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return atE.handled() > n }, 10*time.Second, time.Millisecond)
	replay(t, epP, oldAck, atE)

	stopQ := background(qw)
	defer stopQ()
	err = m.Close() // q acknowledges now; p must still be waited for
	require.ErrorIs(t, err, ErrTimedOut, "settled an importer by an acknowledgement older than its key")
	require.Contains(t, err.Error(), nameP)

	stopP = background(pw)
	require.NoError(t, m.Close())
	stopP()
	_, err = epP.PutNbx([]byte{1}, rkP2.Base(), rkP2, nil)
	require.ErrorIs(t, err, ErrRevoked)
	for _, rk := range []*Rkey{rkP, rkP2, rkQ} {
		require.NoError(t, rk.Close())
	}
}
