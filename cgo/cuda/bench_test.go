package cuda_test

// Benchmarks reproducing DESIGN.md §6's floors through this layer. Each reports
// ns/op for one round trip (or one enqueue) plus µs metrics named after the
// table's rows. Run: go test -run '^$' -bench . ./cgo/cuda (on a GPU machine).

import (
	"fmt"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/cgo/cuda"
	"github.com/ucpx/ucpx/device"
)

func reportUS(b *testing.B, total time.Duration, n int, unit string) {
	if n > 0 {
		b.ReportMetric(float64(total.Nanoseconds())/float64(n)/1000, unit)
	}
}

// BenchmarkStreamMemopRoundTrip: the stream writes T=k, a host goroutine polls T
// and echoes D=k, the stream waits D>=k. Round trips are pre-enqueued behind a
// closed gate (so enqueue cost is excluded), in chunks small enough that the
// pre-enqueue cannot fill the stream's queue; the clock runs from opening the
// gate to the last echo.
func BenchmarkStreamMemopRoundTrip(b *testing.B) {
	for _, mode := range []string{"batch", "single"} {
		b.Run(mode, func(b *testing.B) {
			ctx := newContext(b)
			s := newStream(b, ctx)
			const G, T, D = 0, 1, 2
			w := newWords(b, ctx, 3)
			e := startEcho(w, T, D)
			defer e.Stop()
			const chunk = 120 // 240 memops + the gate
			elapsed, _ := gatedRoundTrips(b, s, w, G, D, chunk, func(k uint64, c int) {
				if mode == "batch" {
					ops := make([]cuda.MemOp, 0, 2*c)
					for i := range uint64(c) {
						ops = append(ops, cuda.WriteValue64Op(w.dev(T), k+i, cuda.WriteDefault), cuda.WaitValue64Op(w.dev(D), k+i, cuda.WaitGEQ))
					}
					require.NoError(b, s.BatchMemOp(ops))
					return
				}
				for i := range uint64(c) {
					require.NoError(b, s.WriteValue64(w.dev(T), k+i, cuda.WriteDefault))
					require.NoError(b, s.WaitValue64(w.dev(D), k+i, cuda.WaitGEQ))
				}
			})
			reportUS(b, elapsed, b.N, "us/roundtrip")
		})
	}
}

// BenchmarkGraphMemopRoundTrip: one graph launch per round trip, the graph being
// one 2-op-plus-rearm batch-memop node [write T=1, wait D==1, write D=0]
// ("one-node") or the trigger and the wait in two chained nodes ("two-nodes").
// The host proxy resets T and sets D. Launch cost is included.
func BenchmarkGraphMemopRoundTrip(b *testing.B) {
	for _, shape := range []string{"one-node", "two-nodes"} {
		b.Run(shape, func(b *testing.B) {
			ctx := newContext(b)
			s := newStream(b, ctx)
			const T, D = 0, 1
			w := newWords(b, ctx, 2)
			g, err := ctx.NewGraph()
			require.NoError(b, err)
			defer g.Close()
			ops := roundTripOps(w, T, D)
			if shape == "one-node" {
				_, err = g.AddBatchMemOpNode(nil, ops)
				require.NoError(b, err)
			} else {
				n1, err := g.AddBatchMemOpNode(nil, ops[:1])
				require.NoError(b, err)
				_, err = g.AddBatchMemOpNode([]cuda.Node{n1}, ops[1:])
				require.NoError(b, err)
			}
			x, err := g.Instantiate(0)
			require.NoError(b, err)
			defer x.Close()
			var count atomic.Int64
			p := startProxy(w, T, D, &count)
			defer p.Stop()
			b.ResetTimer()
			t0 := time.Now()
			for i := 0; i < b.N; i++ {
				require.NoError(b, x.Launch(s))
			}
			require.NoError(b, s.Synchronize())
			elapsed := time.Since(t0)
			b.StopTimer()
			require.Equal(b, int64(b.N), count.Load(), "one trigger per launch")
			reportUS(b, elapsed, b.N, "us/roundtrip")
		})
	}
}

// BenchmarkKernelFlagRoundTrip: one kernel thread writes T=k and spins until the
// host echoes D=k (ucpx_test_echo). Reports the wall-clock time per round trip
// and the kernel's own %globaltimer measurement.
func BenchmarkKernelFlagRoundTrip(b *testing.B) {
	ctx := newContext(b)
	s := newStream(b, ctx)
	m := testModule(b, ctx)
	k := function(b, m, device.KernelEcho)
	const T, D, R0, R1 = 0, 1, 2, 3
	w := newWords(b, ctx, 4)
	e := startEcho(w, T, D)
	defer e.Stop()
	// Warm up: the first launch JITs nothing (LoadModule did) but maps pages.
	require.NoError(b, s.LaunchKernel(k, cuda.Linear(1, 1), w.dev(T), w.dev(D), uint64(0), uint64(10), w.dev(R0)))
	syncWithin(b, s, 10*time.Second)
	base := w.load(T)
	b.ResetTimer()
	t0 := time.Now()
	require.NoError(b, s.LaunchKernel(k, cuda.Linear(1, 1), w.dev(T), w.dev(D), base, uint64(b.N), w.dev(R0)))
	require.NoError(b, s.Synchronize())
	elapsed := time.Since(t0)
	b.StopTimer()
	require.Equal(b, uint64(b.N), w.load(R0), "iterations the kernel did")
	reportUS(b, elapsed, b.N, "us/roundtrip")
	reportUS(b, time.Duration(w.load(R1)), b.N, "us/roundtrip-gpu")
}

// BenchmarkEnqueueMemop: CPU cost of enqueueing one stream memop (the stream
// runs them as fast as they come; ns/op is the enqueue call).
func BenchmarkEnqueueMemop(b *testing.B) {
	cases := []struct {
		name string
		do   func(s *cuda.Stream, w words, i int) error
		per  int
	}{
		{"write64", func(s *cuda.Stream, w words, i int) error {
			return s.WriteValue64(w.dev(0), uint64(i), cuda.WriteDefault)
		}, 1},
		{"wait64-satisfied", func(s *cuda.Stream, w words, i int) error {
			return s.WaitValue64(w.dev(1), 0, cuda.WaitGEQ)
		}, 1},
		{"batch16", func(s *cuda.Stream, w words, i int) error {
			ops := make([]cuda.MemOp, 16)
			for j := range ops {
				ops[j] = cuda.WriteValue64Op(w.dev(0), uint64(i), cuda.WriteDefault)
			}
			return s.BatchMemOp(ops)
		}, 16},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			ctx := newContext(b)
			s := newStream(b, ctx)
			w := newWords(b, ctx, 2)
			timeEnqueues(b, s, func(i int) error { return c.do(s, w, i) })
			if c.per > 1 {
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*c.per), "ns/memop")
			}
		})
	}
}

// BenchmarkLaunchHostFunc: "enqueue" is the CPU cost of cuLaunchHostFunc through
// the Go trampoline; "sequence" is the time per callback when many are queued
// back to back behind a gate (driver callback latency plus the cgo callback).
func BenchmarkLaunchHostFunc(b *testing.B) {
	// enqueue-c is the driver alone (a C function that does nothing, no Go callback),
	// the floor LaunchHostFunc's enqueue is compared with in the same run.
	for _, variant := range []string{"enqueue", "enqueue-c"} {
		b.Run(variant, func(b *testing.B) { benchHostFuncEnqueue(b, variant == "enqueue-c") })
	}
	b.Run("sequence", func(b *testing.B) {
		ctx := newContext(b)
		s := newStream(b, ctx)
		w := newWords(b, ctx, 1)
		var ran atomic.Int64
		inc := func() { ran.Add(1) }
		const chunk = 1000
		var gate uint64
		var elapsed time.Duration
		b.ResetTimer()
		b.StopTimer()
		for done := 0; done < b.N; {
			c := min(chunk, b.N-done)
			gate++
			require.NoError(b, s.WaitValue64(w.dev(0), gate, cuda.WaitGEQ))
			for i := 0; i < c; i++ {
				require.NoError(b, s.LaunchHostFunc(inc))
			}
			want := ran.Load() + int64(c)
			b.StartTimer()
			t0 := time.Now()
			w.store(0, gate)
			for ran.Load() != want {
			}
			elapsed += time.Since(t0)
			b.StopTimer()
			done += c
		}
		require.NoError(b, s.Synchronize())
		reportUS(b, elapsed, b.N, "us/callback")
	})
}

func benchHostFuncEnqueue(b *testing.B, cNoop bool) {
	ctx := newContext(b)
	s := newStream(b, ctx)
	noop := func() {}
	enqueue := func() error { return s.LaunchHostFunc(noop) }
	if cNoop {
		enqueue = s.LaunchHostNoop
	}
	timeEnqueues(b, s, func(int) error { return enqueue() })
	reportUS(b, b.Elapsed(), b.N, "us/enqueue")
}

// timeEnqueues times b.N calls of enqueue(i), synchronizing s every 1024 calls with
// the clock stopped so that the stream's queue never fills, and once more at the end.
func timeEnqueues(b *testing.B, s *cuda.Stream, enqueue func(i int) error) {
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		require.NoError(b, enqueue(i))
		if i%1024 == 1023 {
			b.StopTimer()
			require.NoError(b, s.Synchronize())
			b.StartTimer()
		}
	}
	b.StopTimer()
	require.NoError(b, s.Synchronize())
}

// BenchmarkGraphLaunchMemopNodes: the CPU cost of launching a graph of N batch-memop
// nodes, each writing its own word (nothing waits), against enqueuing the same N
// writes on a stream: the floor under graph conditions' submit cost. Shapes:
// "independent" (N root nodes, as N unrelated communication nodes are), "chain" (a
// line of N nodes), "stream" (N WriteValue64 calls), and the two graph shapes with
// one-thread kernel nodes instead of memop nodes ("kernel-independent", "kernel-chain"). The stream is synchronized
// between iterations, outside the clock.
func BenchmarkGraphLaunchMemopNodes(b *testing.B) {
	for _, n := range []int{1, 16, 256} {
		for _, shape := range []string{"independent", "chain", "stream", "kernel-independent", "kernel-chain"} {
			b.Run(fmt.Sprintf("%s/N=%d", shape, n), func(b *testing.B) {
				ctx := newContext(b)
				s := newStream(b, ctx)
				w := newWords(b, ctx, n)
				var submit func() error
				if shape == "stream" {
					submit = func() error {
						for i := 0; i < n; i++ {
							if err := s.WriteValue64(w.dev(i), 1, cuda.WriteDefault); err != nil {
								return err
							}
						}
						return nil
					}
				} else {
					g, err := ctx.NewGraph()
					require.NoError(b, err)
					defer g.Close()
					var fill *cuda.Function
					if strings.HasPrefix(shape, "kernel") {
						mod, err := ctx.LoadModule(device.TestKernelsPTX())
						require.NoError(b, err)
						defer mod.Close()
						fill, err = mod.Function(device.KernelFill)
						require.NoError(b, err)
					}
					var prev []cuda.Node
					for i := 0; i < n; i++ {
						var nd cuda.Node
						var err error
						if fill != nil { // a one-thread kernel writing one byte of the word
							nd, err = g.AddKernelNode(prev, fill, cuda.Linear(1, 1), w.dev(i), uint64(1), uint32(1<<7))
						} else {
							nd, err = g.AddBatchMemOpNode(prev, []cuda.MemOp{cuda.WriteValue64Op(w.dev(i), 1, cuda.WriteDefault)})
						}
						require.NoError(b, err)
						if strings.HasSuffix(shape, "chain") {
							prev = []cuda.Node{nd}
						}
					}
					x, err := g.Instantiate(0)
					require.NoError(b, err)
					defer x.Close()
					submit = func() error { return x.Launch(s) }
				}
				var elapsed time.Duration
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					t0 := time.Now()
					require.NoError(b, submit())
					elapsed += time.Since(t0)
					b.StopTimer()
					require.NoError(b, s.Synchronize())
					b.StartTimer()
				}
				b.ReportMetric(float64(elapsed.Nanoseconds())/float64(b.N*n), "submit-ns/node")
			})
		}
	}
}

// BenchmarkStreamSignalChain: what a Stream condition's trigger-and-wait costs on a
// stream, with and without GPU work before it, by how the stream signals. Per round
// trip the stream runs [fill kernel] (work=fill: one block of 256 threads writing 8
// bytes of pinned host memory, as a producer would) and then the signal: "memop", one
// batch memop [write T=k, wait D>=k]; or "kernel", one one-thread launch of
// ucpx_signal_write_wait doing the same with a release store and an acquire poll.
// A host goroutine echoes D=T. Pre-enqueued behind a gate as in
// BenchmarkStreamMemopRoundTrip, so the clock sees the GPU's path only.
//
// us/enqueue is the CPU cost of enqueueing one iteration.
// "sync/fill" is the CPU-synchronised counterpart, the (a) mode of `ucpx perf`:
// launch the fill kernel and synchronize the stream, per iteration, clock running.
//
// delay=D: the echo answers D after it sees the trigger (a transfer taking D), and
// us/wake is the round trip less D: whether the stream notices a late completion as
// fast as a prompt one.
func BenchmarkStreamSignalChain(b *testing.B) {
	for _, signal := range []string{"memop", "kernel", "sync"} {
		for _, work := range []string{"none", "fill"} {
			if signal == "sync" && work == "none" {
				continue
			}
			b.Run(signal+"/"+work, func(b *testing.B) { benchSignalChain(b, signal, work == "fill", 0) })
		}
	}
	for _, signal := range []string{"memop", "kernel"} {
		for _, delay := range []time.Duration{2 * time.Microsecond, 5 * time.Microsecond, 10 * time.Microsecond} {
			b.Run(fmt.Sprintf("%s/none/delay=%v", signal, delay), func(b *testing.B) { benchSignalChain(b, signal, false, delay) })
		}
	}
	// The echo, after each store, submits work to the GPU: a memop on another stream
	// ("kick"), or queries the waiting stream ("query"). Does a pending wait get looked
	// at again when the GPU is handed new work?
	for _, signal := range []string{"memop-kick", "memop-query"} {
		for _, delay := range []time.Duration{0, 2 * time.Microsecond, 5 * time.Microsecond} {
			b.Run(fmt.Sprintf("%s/none/delay=%v", signal, delay), func(b *testing.B) { benchSignalChain(b, signal, false, delay) })
		}
	}
	b.Run("memop-kick/fill", func(b *testing.B) { benchSignalChain(b, "memop-kick", true, 0) })
	// The same memop wait on a stream of the highest priority: does the GPU look at a
	// pending wait sooner?
	for _, delay := range []time.Duration{2 * time.Microsecond, 5 * time.Microsecond} {
		b.Run(fmt.Sprintf("memop/none/delay=%v/priority=high", delay), func(b *testing.B) { benchSignalChain(b, "memop-high", false, delay) })
	}
}

// BenchmarkLaunchKernel: the CPU cost of one launch of a one-thread kernel with four
// 8-byte arguments through LaunchKernel ("go"), against the same launches from one C
// loop with the arguments packed once ("c", the driver's own cost), in one run.
//
// "go-locked" is "go" on a goroutine locked to its OS thread: the context stays current
// on that thread, so the per-call context check never switches it.
func BenchmarkLaunchKernel(b *testing.B) {
	for _, variant := range []string{"go", "go-locked", "c"} {
		b.Run(variant, func(b *testing.B) {
			if variant == "go-locked" {
				runtime.LockOSThread()
				defer runtime.UnlockOSThread()
			}
			ctx := newContext(b)
			s := newStream(b, ctx)
			sm, err := ctx.LoadModule(device.SignalKernelsPTX())
			require.NoError(b, err)
			defer sm.Close()
			k := function(b, sm, device.KernelSignalWriteWait)
			w := newWords(b, ctx, 2) // completion already reached: each launch exits at once
			const chunk = 256
			b.ResetTimer()
			for done := 0; done < b.N; {
				c := min(chunk, b.N-done)
				if variant != "c" {
					for i := 0; i < c; i++ {
						require.NoError(b, s.LaunchKernel(k, cuda.Linear(1, 1), w.dev(0), uint64(0), w.dev(1), uint64(0)))
					}
				} else {
					require.NoError(b, s.LaunchKernelRepeatC(k, 1, 1, c, w.dev(0), uint64(0), w.dev(1), uint64(0)))
				}
				done += c
				b.StopTimer()
				require.NoError(b, s.Synchronize())
				b.StartTimer()
			}
		})
	}
}

func benchSignalChain(b *testing.B, signal string, fill bool, delay time.Duration) {
	ctx := newContext(b)
	s := newStream(b, ctx)
	if signal == "memop-high" {
		_, greatest, err := ctx.StreamPriorityRange()
		require.NoError(b, err)
		hs, err := ctx.NewStream(cuda.StreamNonBlocking, greatest)
		require.NoError(b, err)
		defer hs.Close()
		s, signal = hs, "memop"
	}
	tm := testModule(b, ctx)
	fillFn := function(b, tm, device.KernelFill)
	sm, err := ctx.LoadModule(device.SignalKernelsPTX())
	require.NoError(b, err)
	defer sm.Close()
	writeWait := function(b, sm, device.KernelSignalWriteWait)
	buf := hostMem(b, ctx, 4096, cuda.HostAllocPortable|cuda.HostAllocDeviceMap)
	produce := func(i int) error {
		return s.LaunchKernel(fillFn, cuda.Linear(1, 256), buf.DevicePtr(), uint64(8), uint32(i)<<7)
	}
	if signal == "sync" {
		require.NoError(b, produce(0))
		require.NoError(b, s.Synchronize())
		b.ResetTimer()
		t0 := time.Now()
		for i := 0; i < b.N; i++ {
			require.NoError(b, produce(i))
			require.NoError(b, s.Synchronize())
		}
		reportUS(b, time.Since(t0), b.N, "us/iteration")
		return
	}
	const G, T, D, K = 0, 1, 2, 3
	w := newWords(b, ctx, 4)
	var then func()
	var thenErr error // the echo's first error, checked at the end (not its goroutine's to fail)
	switch signal {
	case "memop-kick":
		ks, err := ctx.NewStream(cuda.StreamNonBlocking, 0)
		require.NoError(b, err)
		defer ks.Close()
		then = func() {
			if err := ks.WriteValue64(w.dev(K), 1, cuda.WriteDefault); err != nil && thenErr == nil {
				thenErr = err
			}
		}
		signal = "memop"
	case "memop-query":
		then = func() {
			if _, err := s.Query(); err != nil && thenErr == nil {
				thenErr = err
			}
		}
		signal = "memop"
	}
	e := startDelayedEchoThen(w, T, D, delay, then)
	defer func() {
		e.Stop()
		require.NoError(b, thenErr)
	}()
	const chunk = 100
	elapsed, enqueue := gatedRoundTrips(b, s, w, G, D, chunk, func(k uint64, c int) {
		for i := range uint64(c) {
			k := k + i
			if fill {
				require.NoError(b, produce(int(k)))
			}
			if signal == "memop" {
				require.NoError(b, s.BatchMemOp([]cuda.MemOp{cuda.WriteValue64Op(w.dev(T), k, cuda.WriteDefault), cuda.WaitValue64Op(w.dev(D), k, cuda.WaitGEQ)}))
			} else {
				require.NoError(b, s.LaunchKernel(writeWait, cuda.Linear(1, 1), w.dev(T), k, w.dev(D), k))
			}
		}
	})
	reportUS(b, elapsed, b.N, "us/roundtrip")
	reportUS(b, enqueue, b.N, "us/enqueue") // CPU cost of one iteration's launches
	if delay > 0 {
		reportUS(b, elapsed-time.Duration(b.N)*delay, b.N, "us/wake")
	}
}
