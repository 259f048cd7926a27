package stream

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/cgo/cuda"
	"github.com/ucpx/ucpx/internal/testenv"
)

// ownExportState is what ownExports holds: its entries, and the entries at which the
// next export sweeps them. The two indexes must agree.
func ownExportState(t *testing.T) (entries, sweepAt int) {
	t.Helper()
	ownExports.Lock()
	defer ownExports.Unlock()
	require.Len(t, ownExports.byHandle, len(ownExports.byBase), "ownExports' indexes disagree")
	for base, x := range ownExports.byBase {
		require.Equal(t, base, ownExports.byHandle[x.handle], "ownExports' indexes disagree at %#x", base)
	}
	return len(ownExports.byBase), ownExports.sweepAt
}

// ownExportAt is the allocation ownExports holds at base, and whether it holds one.
func ownExportAt(base uintptr) (IPCAllocation, bool) {
	ownExports.Lock()
	defer ownExports.Unlock()
	if x := ownExports.byBase[uint64(base)]; x != nil {
		return x.alloc, true
	}
	return IPCAllocation{}, false
}

// openOwnAt opens h, which this process exported for the live allocation at base: the
// allocation's own address comes back, and closes like any mapping.
func openOwnAt(t *testing.T, b *cudaBackend, h IPCHandle, base uintptr) {
	t.Helper()
	p, err := b.IPCOpenMemHandle(h)
	require.NoError(t, err, "opening this process's handle of %#x", base)
	require.Equal(t, base, p)
	require.NoError(t, b.IPCCloseMemHandle(p))
}

// A long-running process exports allocations at ever new addresses and frees them
// (cuMemAlloc/export/cuMemFree cycles): the handles remembered for opens in this
// process stay about as many as the live exports, not one per address ever used, and
// every live export still opens as itself while a freed one opens nothing. Before,
// ownExports kept an entry per base ever exported and each export scanned them all.
func TestCUDAOwnExportsBounded(t *testing.T) {
	b := newCUDABackend(t).(*cudaBackend)
	ctx, _, _ := CUDAContext(b)
	start, sweepAt := ownExportState(t)
	// Each sweep leaves the live entries (those before the test and its one live
	// export), and the next comes when they have doubled.
	bound := max(sweepAt, ownExportsSweepMin, 2*(start+1))
	distinct := map[uintptr]bool{}
	most, cycles := 0, 0
	var first IPCHandle
	// Until the freed allocations used well more addresses than the bound allows
	// entries.
	for ; len(distinct) <= 4*bound; cycles++ {
		require.Less(t, cycles, 16*ownExportsSweepMin, "the allocator gave too few distinct addresses to tell")
		// A spacer as large as the allocation before it keeps every freed one a hole
		// that no later, larger allocation fits: a new address each cycle.
		size := 512 * (cycles + 1)
		m, err := ctx.MemAlloc(size)
		require.NoError(t, err)
		spacer, err := ctx.MemAlloc(size)
		require.NoError(t, err)
		defer spacer.Close()
		h, err := b.IPCGetMemHandle(m.Ptr())
		require.NoError(t, err)
		if cycles == 0 {
			first = h
		}
		openOwnAt(t, b, h, m.Ptr())
		distinct[m.Ptr()] = true
		n, _ := ownExportState(t)
		most = max(most, n)
		require.NoError(t, m.Close())
	}
	t.Logf("%d cycles at %d addresses: at most %d entries (bound %d)", cycles, len(distinct), most, bound)
	require.LessOrEqual(t, most, bound, "ownExports grew with the addresses used (%d) rather than the live exports", len(distinct))
	_, err := b.IPCOpenMemHandle(first)
	require.Error(t, err, "the handle of a freed allocation opened")
}

// An allocation freed and replaced at the same base (a new buffer id) is not the one
// exported there before: the old handle does not open it, the new export replaces the
// old entry (one entry at the base), and it opens as itself until it is freed.
func TestCUDAOwnExportsReplaced(t *testing.T) {
	b := newCUDABackend(t).(*cudaBackend)
	ctx, _, _ := CUDAContext(b)
	const size = 1 << 16
	var (
		base uintptr
		a1   IPCAllocation
		h1   IPCHandle
		m2   *cuda.DeviceMemory
	)
	// Where the allocator gives the freed address to the next allocation of its size
	// (the driver's and the fake's do from a fresh spot): try until it does.
	for range 64 {
		m1, err := ctx.MemAlloc(size)
		require.NoError(t, err)
		base = m1.Ptr()
		a1, err = b.IPCAllocation(base)
		require.NoError(t, err)
		h1, err = b.IPCGetMemHandle(base)
		require.NoError(t, err)
		openOwnAt(t, b, h1, base)
		require.NoError(t, m1.Close())
		m, err := ctx.MemAlloc(size)
		require.NoError(t, err)
		if m.Ptr() == base {
			m2 = m
			break
		}
		defer m.Close() // elsewhere: kept, so the next try starts from another spot
	}
	require.NotNil(t, m2, "no allocation came back at the address of one freed")
	before, _ := ownExportState(t)
	a2, err := b.IPCAllocation(base)
	require.NoError(t, err)
	require.NotEqual(t, a1.BufferID, a2.BufferID)

	_, err = b.IPCOpenMemHandle(h1)
	require.Error(t, err, "the handle of the freed allocation opened its replacement")
	h2, err := b.IPCGetMemHandle(base)
	require.NoError(t, err)
	got, ok := ownExportAt(base)
	require.True(t, ok)
	require.Equal(t, a2.BufferID, got.BufferID)
	n, _ := ownExportState(t)
	require.Equal(t, before, n, "the replacement took a second entry")
	openOwnAt(t, b, h2, base)

	require.NoError(t, m2.Close())
	_, err = b.IPCOpenMemHandle(h2)
	require.Error(t, err, "the handle of a freed allocation opened")
	_, ok = ownExportAt(base)
	require.False(t, ok, "the entry of a freed allocation stayed after its open failed")
}

// The entries of a backend's exports go with the last backend that exported them, at
// its release (its streams closed too), and only then.
func TestCUDAOwnExportsGoWithBackend(t *testing.T) {
	b1 := newCUDABackend(t).(*cudaBackend)
	ctx, _, _ := CUDAContext(b1)
	b, err := openCUDA(0)
	require.NoError(t, err)
	b2 := b.(*cudaBackend)
	t.Cleanup(func() { _ = b2.Close() })
	shared, err := ctx.MemAlloc(1 << 12)
	require.NoError(t, err)
	defer shared.Close()
	own2, err := ctx.MemAlloc(1 << 12)
	require.NoError(t, err)
	defer own2.Close()

	start, _ := ownExportState(t)
	hs, err := b1.IPCGetMemHandle(shared.Ptr())
	require.NoError(t, err)
	_, err = b2.IPCGetMemHandle(shared.Ptr())
	require.NoError(t, err)
	h2, err := b2.IPCGetMemHandle(own2.Ptr())
	require.NoError(t, err)
	n, _ := ownExportState(t)
	require.Equal(t, start+2, n)

	s, err := b2.NewStream()
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	require.NoError(t, b2.Close())
	n, _ = ownExportState(t)
	require.Equal(t, start+2, n, "entries went before the backend was released")
	openOwnAt(t, b1, h2, own2.Ptr())

	require.NoError(t, s.Close()) // the last reference: b2 is released
	n, _ = ownExportState(t)
	require.Equal(t, start+1, n, "the released backend's own export stayed")
	_, ok := ownExportAt(own2.Ptr())
	require.False(t, ok)
	openOwnAt(t, b1, hs, shared.Ptr()) // b1 exported it too
}

// Exports, opens and sweeps of several goroutines and backends at once agree: every
// live export opens as itself, and the entries stay bounded.
func TestCUDAOwnExportsConcurrent(t *testing.T) {
	bs := []*cudaBackend{newCUDABackend(t).(*cudaBackend), newCUDABackend(t).(*cudaBackend)}
	ctx, _, _ := CUDAContext(bs[0])
	start, sweepAt := ownExportState(t)
	const workers, cycles = 4, 4 * ownExportsSweepMin
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b := bs[w%len(bs)]
			errs <- func() error {
				for i := range cycles {
					m, err := ctx.MemAlloc(256 * (1 + (i+w)%16))
					if err != nil {
						return err
					}
					h, err := b.IPCGetMemHandle(m.Ptr())
					if err != nil {
						return err
					}
					p, err := b.IPCOpenMemHandle(h)
					if err != nil {
						return err
					}
					if p != m.Ptr() {
						return fmt.Errorf("the export of %#x opened at %#x", m.Ptr(), p)
					}
					if err := errors.Join(b.IPCCloseMemHandle(p), m.Close()); err != nil {
						return err
					}
				}
				return nil
			}()
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	n, _ := ownExportState(t)
	require.LessOrEqual(t, n, max(sweepAt, ownExportsSweepMin, 2*(start+workers)))
}

// TestCUDAIPCFakeDriver runs this file's GPU tests against the fake driver.
func TestCUDAIPCFakeDriver(t *testing.T) {
	out := testenv.RunUnderFakeDriver(t, []string{"TestCUDAOwnExportsBounded", "TestCUDAOwnExportsReplaced",
		"TestCUDAOwnExportsGoWithBackend", "TestCUDAOwnExportsConcurrent"})
	for line := range strings.Lines(out) {
		if strings.Contains(line, "cycles at") {
			t.Log(strings.TrimSpace(line))
		}
	}
}
