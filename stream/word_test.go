package stream

import (
	"errors"
	"math"
	"sync"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/stream/streamcore"
)

func TestCompareHolds(t *testing.T) {
	const top = math.MaxUint64
	cases := []struct {
		cmp            Compare
		current, value uint64
		want           bool
	}{
		{GEQ, 5, 5, true},
		{GEQ, 6, 5, true},
		{GEQ, 4, 5, false},
		{GEQ, 0, top, true}, // 0 is one past top
		{GEQ, top, 0, false},
		{GEQ, 1 << 62, 0, true},
		{GEQ, 1 << 63, 0, false}, // half the range ahead reads as behind
		{GEQ, 3, top - 3, true},
		{EQ, 7, 7, true},
		{EQ, 7, 8, false},
		{EQ, top, top, true},
		{AND, 0b1010, 0b0010, true},
		{AND, 0b1010, 0b0101, false},
		{AND, 0, top, false},
		{NOR, 0, 0, true},
		{NOR, top, 0, false},
		{NOR, 0xF0, ^uint64(0xF0), false},
		{NOR, 0x70, ^uint64(0xF0), true},
		{Compare(9), 1, 1, false},
	}
	for _, tc := range cases {
		require.Equal(t, tc.want, tc.cmp.Holds(tc.current, tc.value), "%v(%#x, %#x)", tc.cmp, tc.current, tc.value)
	}
}

func TestEnumStrings(t *testing.T) {
	require.Equal(t, "GEQ", GEQ.String())
	require.Equal(t, "EQ", EQ.String())
	require.Equal(t, "AND", AND.String())
	require.Equal(t, "NOR", NOR.String())
	require.Equal(t, "Compare(7)", Compare(7).String())
	require.Equal(t, "host", KindHost.String())
	require.Equal(t, "cuda", KindCUDA.String())
	require.Equal(t, "Kind(0)", Kind(0).String())
}

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

func TestWordBlockCloseOnce(t *testing.T) {
	var mem [4]uint64
	frees := 0
	wb := NewWordBlock(KindCUDA, unsafe.Pointer(&mem[0]), 0x1000, 4, func() error { frees++; return nil })
	require.Equal(t, 4, wb.Len())
	require.Equal(t, KindCUDA, wb.Word(3).Kind())
	require.Equal(t, uintptr(0x1018), wb.Word(3).DevicePtr())
	require.Equal(t, uintptr(unsafe.Pointer(&mem[3])), wb.Word(3).HostPtr())
	require.False(t, wb.Closed())
	require.NoError(t, wb.Close())
	require.True(t, wb.Closed())
	require.ErrorIs(t, wb.Close(), ErrClosed)
	require.Equal(t, 1, frees)
}

// Ring calls the block's doorbell until the block is freed; blocks without one (host
// backends) have nothing to ring.
func TestWordBlockRing(t *testing.T) {
	host := NewHostBackend()
	defer host.Close()
	hb, err := host.AllocWords(1)
	require.NoError(t, err)
	defer hb.Close()
	require.NoError(t, hb.Ring())

	var mem [1]uint64
	rings := 0
	bellErr := errors.New("doorbell failed")
	wb := streamcore.NewWordBlock(KindCUDA, unsafe.Pointer(&mem[0]), 0x1000, 1, func() error { return nil },
		func() error { rings++; return bellErr })
	require.ErrorIs(t, wb.Ring(), bellErr)
	require.Equal(t, 1, rings)
	require.NoError(t, wb.Close())
	require.NoError(t, wb.Ring())
	require.Equal(t, 1, rings, "a freed block rang its doorbell")
}

// TestWordBlockBadConstruction: a zero WordBlock, a nil free and a negative count
// give errors, never a panic (they used to nil-deref and makeslice-panic).
func TestWordBlockBadConstruction(t *testing.T) {
	var zero WordBlock
	require.ErrorIs(t, zero.Close(), ErrInvalidArgument)

	var x [4]uint64
	wb := NewWordBlock(KindHost, unsafe.Pointer(&x[0]), 0, 2, nil)
	require.Equal(t, 2, wb.Len())
	require.NoError(t, wb.Close(), "nil free: nothing to free")
	require.ErrorIs(t, wb.Close(), ErrClosed)

	freed := false
	neg := NewWordBlock(KindHost, unsafe.Pointer(&x[0]), 0, -1, func() error { freed = true; return nil })
	require.Equal(t, 0, neg.Len())
	require.True(t, neg.Closed())
	require.Nil(t, neg.Word(0))
	require.ErrorIs(t, neg.Close(), ErrInvalidArgument)
	require.False(t, freed)

	nilBase := NewWordBlock(KindHost, nil, 0, 1, nil)
	require.Equal(t, 0, nilBase.Len())
	require.ErrorIs(t, nilBase.Close(), ErrInvalidArgument)

	b := NewHostBackend()
	defer b.Close()
	s, err := b.NewStream()
	require.NoError(t, err)
	require.Error(t, s.WriteValue(neg.Word(0), 1))
}
