package stream

// Inside timed loops an error is checked before require.NoError is called:
// require calls b.Helper on every call, whose cost would be measured with the
// operation.

import (
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// BenchmarkHostEnqueueWriteValue: CPU cost of enqueueing one WriteValue while the
// executor drains concurrently (CUDA memop enqueue: ~2 µs).
func BenchmarkHostEnqueueWriteValue(b *testing.B) {
	be := newTestBackend(b)
	s := newTestStream(b, be)
	w := newTestWords(b, be, 1).Word(0)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		if err := s.WriteValue(w, uint64(i)); err != nil {
			require.NoError(b, err)
		}
	}
	b.StopTimer()
	require.NoError(b, s.Synchronize())
}

// BenchmarkHostEnqueueWriteValueParallel: the same with many goroutines sharing a stream.
func BenchmarkHostEnqueueWriteValueParallel(b *testing.B) {
	be := newTestBackend(b)
	s := newTestStream(b, be)
	w := newTestWords(b, be, 1).Word(0)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := s.WriteValue(w, 1); err != nil {
				assert.NoError(b, err)
				return
			}
		}
	})
	b.StopTimer()
	require.NoError(b, s.Synchronize())
}

// BenchmarkHostEnqueueHostFunc: enqueue cost of LaunchHostFunc with a preallocated
// func (cuLaunchHostFunc: 1.4 µs).
func BenchmarkHostEnqueueHostFunc(b *testing.B) {
	be := newTestBackend(b)
	s := newTestStream(b, be)
	fn := func() {}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if err := s.LaunchHostFunc(fn); err != nil {
			require.NoError(b, err)
		}
	}
	b.StopTimer()
	require.NoError(b, s.Synchronize())
}

// BenchmarkHostRoundTrip: the stream-channel round trip. The stream writes T=k, a
// polling goroutine (the proxy) sees it and writes D=k, the stream waits D>=k. The
// iterations are enqueued before the clock runs, behind a gate opened when it starts
// (CUDA memop round trip, pre-enqueued: 5–6 µs). They are enqueued in rounds of at
// most roundTripChunk so that a huge b.N does not measure the garbage collector
// scanning a gigabyte of queue.
func BenchmarkHostRoundTrip(b *testing.B) {
	be := newTestBackend(b)
	s := newTestStream(b, be)
	words := newTestWords(b, be, 2)
	trigger, completion := words.Word(0), words.Word(1)
	n := uint64(b.N)
	proxyDone := make(chan struct{})
	go func() {
		defer close(proxyDone)
		for k := uint64(1); k <= n; k++ {
			for spins := 0; trigger.Load() < k; spins++ {
				if spins%(1<<16) == 0 {
					runtime.Gosched() // only matters with GOMAXPROCS=1
				}
			}
			completion.Store(k)
		}
	}()
	b.ResetTimer()
	for first := uint64(1); first <= n; first += roundTripChunk {
		b.StopTimer()
		hold, release := gate()
		require.NoError(b, s.LaunchHostFunc(hold))
		for k := first; k < first+roundTripChunk && k <= n; k++ {
			require.NoError(b, s.WriteValue(trigger, k))
			require.NoError(b, s.WaitValue(completion, k, GEQ))
		}
		b.StartTimer()
		release()
		require.NoError(b, s.Synchronize())
	}
	b.StopTimer()
	<-proxyDone
}

const roundTripChunk = 1 << 16

// BenchmarkHostSynchronize: enqueue one WriteValue and Synchronize, the latency a
// caller sees for a trivial stream round trip from the host.
func BenchmarkHostSynchronize(b *testing.B) {
	be := newTestBackend(b)
	s := newTestStream(b, be)
	w := newTestWords(b, be, 1).Word(0)
	b.ResetTimer()
	for i := range b.N {
		if err := s.WriteValue(w, uint64(i)); err != nil {
			require.NoError(b, err)
		}
		if err := s.Synchronize(); err != nil {
			require.NoError(b, err)
		}
	}
}

// BenchmarkHostEventRoundTrip: two streams ping-ponging through events; one
// iteration is two cross-stream hops (A waits for C, C waits for A). Pre-enqueued in
// rounds like BenchmarkHostRoundTrip.
func BenchmarkHostEventRoundTrip(b *testing.B) {
	be := newTestBackend(b)
	a, c := newTestStream(b, be), newTestStream(b, be)
	ea, ec := mustEventB(b, be), mustEventB(b, be)
	fn := func() {}
	b.ResetTimer()
	for done := 0; done < b.N; done += roundTripChunk {
		b.StopTimer()
		hold, release := gate()
		_ = a.LaunchHostFunc(hold)
		for i := done; i < done+roundTripChunk && i < b.N; i++ {
			_ = a.WaitEvent(ec)
			_ = a.LaunchHostFunc(fn)
			_ = a.Record(ea)
			_ = c.WaitEvent(ea)
			_ = c.LaunchHostFunc(fn)
			_ = c.Record(ec)
		}
		b.StartTimer()
		release()
		require.NoError(b, c.Synchronize())
	}
}

func mustEventB(b *testing.B, be Backend) Event {
	b.Helper()
	e, err := be.NewEvent()
	require.NoError(b, err)
	return e
}
