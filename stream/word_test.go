package stream

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// Word and WordBlock live in streamcore (its tests cover the block itself); these run
// them on the words of a backend.

func TestWordOperations(t *testing.T) {
	b := newTestBackend(t)
	wb := newTestWords(t, b, 2)
	w := wb.Word(1)
	w.Store(10)
	require.Equal(t, uint64(10), w.Load())
	require.Equal(t, uint64(15), w.Add(5))
	require.False(t, w.CompareAndSwap(10, 20))
	require.True(t, w.CompareAndSwap(15, 20))
	require.Equal(t, uint64(20), w.Load())
	require.Zero(t, wb.Word(0).Load(), "neighbour untouched")
	require.Contains(t, w.String(), "Word(host host=0x")

	// Concurrent adds from many goroutines are atomic.
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 1000 {
				w.Add(1)
			}
		}()
	}
	wg.Wait()
	require.Equal(t, uint64(8020), w.Load())
}

// Blocks of the host backend have no doorbell: Ring does nothing.
func TestHostWordBlockRing(t *testing.T) {
	host := NewHostBackend()
	defer host.Close()
	hb, err := host.AllocWords(1)
	require.NoError(t, err)
	defer hb.Close()
	require.NoError(t, hb.Ring())
}
