package ucp

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/internal/testenv/fakeipc"
)

// revokeModes runs f with importers revoked directly (same process) and through the
// message protocol (as between processes).
func revokeModes(t *testing.T, f func(t *testing.T, p *pair)) {
	inRevokeModes(t, func(t *testing.T) { pairs(t, f) })
}

// inRevokeModes runs f once with revocations delivered directly and once by message.
func inRevokeModes(t *testing.T, f func(t *testing.T)) {
	for _, direct := range []bool{true, false} {
		name := "messages"
		if direct {
			name = "direct"
		}
		t.Run(name, func(t *testing.T) {
			old := revokeInProcess
			revokeInProcess = direct
			defer func() { revokeInProcess = old }()
			f(t)
		})
	}
}

// waitImported waits until m's exporter counts n keys of m unpacked in importer (an
// import notice is a message: a Close before it arrives does not wait for the key).
func waitImported(t *testing.T, m *MemH, importer *Context, n int) {
	t.Helper()
	require.Eventually(t, func() bool {
		m.ctx.mu.Lock()
		defer m.ctx.mu.Unlock()
		imp := m.importers[importer.trust.id]
		return imp != nil && imp.count == n
	}, 5*time.Second, time.Millisecond)
}

func TestRevokedKeyFailsAndLaterMemoryStaysIntact(t *testing.T) {
	revokeModes(t, func(t *testing.T, p *pair) {
		m, err := p.ctxB.MemAlloc(4096)
		require.NoError(t, err)
		packed, err := m.PackRkey()
		require.NoError(t, err)
		rk, err := p.epA.UnpackRkey(packed)
		require.NoError(t, err)
		data := pattern(512, 5)
		r, err := p.epA.PutNbx(data, rk.Base(), rk, nil)
		require.NoError(t, err)
		p.wait(t, r)
		require.Equal(t, data, m.Bytes()[:512])

		stop := background(p.a) // the importer acknowledges from its own progress
		require.NoError(t, m.Close())
		stop()
		require.Nil(t, m.Bytes(), "Bytes after Close")

		_, err = p.epA.PutNbx(data, rk.Base(), rk, nil)
		require.ErrorIs(t, err, ErrRevoked)
		_, err = p.epA.GetNbx(make([]byte, 8), rk.Base(), rk, nil)
		require.ErrorIs(t, err, ErrRevoked)
		_, err = p.epA.AtomicNbx(AtomicParam{Op: AtomicAdd, Operand: 1}, rk.Base(), rk, nil)
		require.ErrorIs(t, err, ErrRevoked)

		// Allocations made afterwards (the allocator may hand out the same pages) are
		// never written by the stale key.
		var later []*MemH
		var sums []uint32
		for i := 0; i < 64; i++ {
			n := 4096
			if i%16 == 15 {
				n = 8 << 20
			}
			lm, err := p.ctxB.MemAlloc(n)
			require.NoError(t, err)
			copy(lm.Bytes(), pattern(n, int64(i)))
			later = append(later, lm)
			sums = append(sums, checksum(lm.Bytes()))
		}
		for off := uint64(0); off < 4096; off += 512 {
			_, err = p.epA.PutNbx(make([]byte, 512), rk.Base()+off, rk, nil)
			require.ErrorIs(t, err, ErrRevoked)
		}
		for i := 0; i < 100; i++ {
			p.a.Progress()
			p.b.Progress()
		}
		for i, lm := range later {
			require.Equal(t, sums[i], checksum(lm.Bytes()), "allocation %d changed", i)
			require.NoError(t, lm.Close())
		}
		require.NoError(t, rk.Close())
		require.ErrorIs(t, m.Close(), ErrClosed)
	})
}

// An importer that neither acknowledges nor fails keeps the memory registered; Close
// names it, and succeeds once it answers.
func TestRevokeWaitsForSilentImporter(t *testing.T) {
	old := revokeInProcess
	revokeInProcess = false
	defer func() { revokeInProcess = old }()
	p := newShmPair(t)
	m, err := p.ctxB.MemAlloc(64)
	require.NoError(t, err)
	p.ctxB.revokeTimeout = 200 * time.Millisecond
	packed, err := m.PackRkey()
	require.NoError(t, err)
	rk, err := p.epA.UnpackRkey(packed)
	require.NoError(t, err)
	err = m.Close() // A does not progress
	require.ErrorIs(t, err, ErrTimedOut)
	require.Contains(t, err.Error(), "peer ")
	require.NotNil(t, m.Bytes(), "released while a peer still held the key")
	_, err = m.PackRkey()
	require.ErrorIs(t, err, ErrRevoked)
	stop := background(p.a)
	require.NoError(t, m.Close())
	stop()
	_, err = p.epA.PutNbx([]byte{1}, rk.Base(), rk, nil)
	require.ErrorIs(t, err, ErrRevoked)
	require.NoError(t, rk.Close())

	// An importer that closed its key first is not waited for.
	m2, err := p.ctxB.MemAlloc(64)
	require.NoError(t, err)
	packed, err = m2.PackRkey()
	require.NoError(t, err)
	rk, err = p.epA.UnpackRkey(packed)
	require.NoError(t, err)
	require.NoError(t, rk.Close())
	require.NoError(t, m2.Close())
}

// The exporter counts importers per context: a revocation reaches every worker of the
// importing context that unpacked the key, and Close returns only once all of them
// flushed and unmapped it (after an acknowledgement of one worker, the other's puts
// wrote into the freed memory).
func TestRevokeReachesEveryWorkerOfImporter(t *testing.T) {
	inRevokeModes(t, func(t *testing.T) {
		ca, cb := fakeDeviceContexts(t)
		wb, err := cb.NewWorker(WorkerParams{})
		require.NoError(t, err)
		a1, err := ca.NewWorker(WorkerParams{})
		require.NoError(t, err)
		a2, err := ca.NewWorker(WorkerParams{})
		require.NoError(t, err)
		ep1, _ := connectWorkers(t, a1, wb)
		ep2, _ := connectWorkers(t, a2, wb)
		t.Cleanup(background(wb))
		t.Cleanup(background(a1))
		t.Cleanup(background(a2))

		const n = 64 << 10
		alloc := fakeipc.Malloc(n)
		m, packed := deviceRegion(t, cb, alloc, 0, n)
		rk1, err := ep1.UnpackRkey(packed)
		require.NoError(t, err)
		rk2, err := ep2.UnpackRkey(packed)
		require.NoError(t, err)
		waitImported(t, m, ca, 2)

		require.NoError(t, m.Close())
		mapped := fakeipc.Mapped(alloc.Ptr())
		alloc.Free() // what the exporter does next
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		for i, rk := range []*Rkey{rk1, rk2} {
			r, err := rk.ep.PutNbx(pattern(n, 1), rk.Base(), rk, nil)
			if err == nil {
				_ = r.Wait(ctx)
			}
			require.ErrorIs(t, err, ErrRevoked, "worker %d's key", i+1)
			require.NoError(t, rk.Close())
		}
		require.Zero(t, mapped, "mapped after the exporter's Close returned")
	})
}

// A key unpacked after its region was closed (a stale packed key) never writes into
// the memory: in this process the unpack fails; from another, the exporter answers the
// import with the revocation, which unmaps the key.
func TestRevokeUnpackAfterMemHClose(t *testing.T) {
	inRevokeModes(t, func(t *testing.T) {
		p, _ := ipcPair(t)
		t.Cleanup(background(p.a))
		const n = 4096
		alloc := fakeipc.Malloc(n)
		m, packed := deviceRegion(t, p.ctxB, alloc, 0, n)
		require.NoError(t, m.Close()) // nobody imported it: released at once
		rk, err := p.epA.UnpackRkey(packed)
		if err != nil {
			require.ErrorIs(t, err, ErrRevoked)
			require.True(t, revokeInProcess, "refused at the unpack in another process")
		} else {
			defer rk.Close()
		}
		// From another process the key works until the revocation arrives (documented
		// on addRkeyUnlock): give it the time.
		for deadline := time.Now().Add(2 * time.Second); fakeipc.Mapped(alloc.Ptr()) > 0 && time.Now().Before(deadline); {
			time.Sleep(time.Millisecond)
		}
		mapped := fakeipc.Mapped(alloc.Ptr())
		alloc.Free()
		if rk != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			r, err := p.epA.PutNbx(pattern(n, 3), rk.Base(), rk, nil)
			if err == nil {
				_ = r.Wait(ctx)
			}
			require.ErrorIs(t, err, ErrRevoked)
		}
		require.Zero(t, mapped, "the stale key is unmapped")
	})
}
