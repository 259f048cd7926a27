package tests

import (
	"bytes"
	"context"
	"hash/crc32"
	"runtime"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/condition"
	"github.com/ucpx/ucpx/graph"
	"github.com/ucpx/ucpx/internal/testenv/streamenv"
	"github.com/ucpx/ucpx/stream"
	"github.com/ucpx/ucpx/ucp"
)

// The race detector must see every ordering the engine guarantees, or correct
// programs get race reports under `go test -race`. Each test below is a correct
// program whose only ordering between two Go accesses to the same memory is one the
// engine guarantees through a signal word, and it checks the data. Under -race each
// fails if its ordering is invisible to the detector; without -race they check data.
//
// What would order the two accesses anyway, and so hide a missing edge, is avoided
// on purpose:
//   - kicking a parked engine (a channel send): the sleeps before the triggers let the
//     engine take the operation and leave its parked state first;
//   - the waiting side running the engine's round itself (the engine's lock) or being
//     woken through a word's notification: it reaches its wait after the completion;
//   - calls into C: the detector takes every cgo call as ordered after every earlier
//     one, so the waiting side does not wait for a goroutine that called into C
//     after the engine did;
//   - waiting on the waiting stream (Synchronize) before it ran: the waiter tells the
//     stream's executor how far it waits, which orders the two.
// And what the detector needs to report a race at all: the goroutine of the first
// access still runs at the second (an access of a goroutine that ended may go
// unreported), and both accesses are copies, not byte-by-byte loops (see fillPattern).

// raceOrderEnv is what every race-order test uses: two workers of one process over
// shared memory and a host backend.
type raceOrderEnv struct {
	recvW   *ucp.Worker
	toRecv  *ucp.Endpoint // sendW's endpoint to recvW
	backend stream.Backend
	ctx     context.Context
}

func newRaceOrderEnv(t *testing.T) *raceOrderEnv {
	t.Helper()
	recvW, _, toRecv, _ := shmWorkers(t)
	backend := streamenv.HostBackend(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return &raceOrderEnv{recvW: recvW, toRecv: toRecv, backend: backend, ctx: ctx}
}

func (e *raceOrderEnv) stream(t *testing.T) stream.Stream {
	t.Helper()
	s, err := e.backend.NewStream()
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// recv posts an ordinary (unconditioned) receive of n bytes with tag on recvW.
func (e *raceOrderEnv) recv(t *testing.T, n int, tag uint64) ([]byte, *ucp.Request) {
	t.Helper()
	buf := make([]byte, n)
	r, err := e.recvW.TagRecvNbx(buf, tag, ^uint64(0), nil)
	require.NoError(t, err)
	return buf, r
}

// settle gives the engine time to take a just-submitted operation and leave its
// parked state: a trigger stored while it is parked kicks it through a channel,
// which the detector sees, and which would hide a missing edge.
func settle() { time.Sleep(5 * time.Millisecond) }

// fillPattern writes a pattern made from seed into b, with one copy: the detector
// checks a copy's whole range, where it may miss a race between two byte-by-byte
// loops (it keeps a few accesses per 8 bytes of memory).
func fillPattern(b []byte, seed byte) {
	copy(b, makePattern(len(b), seed))
}

func makePattern(n int, seed byte) []byte {
	p := make([]byte, n)
	for i := range p {
		p[i] = seed + byte(i*7) + byte(i>>8)
	}
	return p
}

func patternSum(n int, seed byte) uint32 { return crc32.ChecksumIEEE(makePattern(n, seed)) }

// readSum checksums b after reading it with a copy: crc32's assembly is not
// instrumented, so the copy is the read the detector sees.
func readSum(b []byte) uint32 { return crc32.ChecksumIEEE(bytes.Clone(b)) }

var raceOrderSizes = []int{64, 256 << 10}

// Trigger store -> engine issue: data written before the trigger (by the stream's
// host function, or by the goroutine that calls condition.Trigger) is what the
// operation sends, and once the Request is done the buffer may be written again.
func TestRaceOrderTriggerToIssue(t *testing.T) {
	t.Run("stream", func(t *testing.T) {
		e := newRaceOrderEnv(t)
		a := e.stream(t)
		cond, err := condition.Create(condition.Param{Category: condition.Stream, Backend: e.backend, Stream: a})
		require.NoError(t, err)
		for i, n := range raceOrderSizes {
			tag, seed := uint64(0x7100+i), byte(3*i+1)
			buf := make([]byte, n)
			got, rr := e.recv(t, n, tag)
			gate := make(chan struct{})
			require.NoError(t, a.LaunchHostFunc(func() {
				<-gate
				fillPattern(buf, seed) // the stream writes the send buffer, then triggers
			}))
			sr, err := e.toRecv.TagSendNbx(buf, tag, &ucp.RequestParam{Condition: cond, Flags: ucp.NonBlockingEnqueue})
			require.NoError(t, err)
			settle()
			close(gate)
			require.NoError(t, rr.Wait(e.ctx))
			require.NoError(t, sr.Wait(e.ctx))
			require.Equal(t, patternSum(n, seed), crc32.ChecksumIEEE(got), "size %d: received data", n)
			fillPattern(buf, seed+1) // the send is done: the buffer is the program's again
		}
		require.NoError(t, a.Synchronize())
		require.NoError(t, cond.Destroy())
	})
	t.Run("kernel-triggered", func(t *testing.T) {
		e := newRaceOrderEnv(t)
		cond, err := condition.Create(condition.Param{Category: condition.KernelTriggered, Backend: e.backend})
		require.NoError(t, err)
		for i, n := range raceOrderSizes {
			tag, seed := uint64(0x7200+i), byte(5*i+2)
			buf := make([]byte, n)
			got, rr := e.recv(t, n, tag)
			sr, err := e.toRecv.TagSendNbx(buf, tag, &ucp.RequestParam{Condition: cond})
			require.NoError(t, err)
			h, err := cond.DeviceHandle()
			require.NoError(t, err)
			settle()
			triggered := make(chan error, 1)
			hold := make(chan struct{})
			go func() {
				fillPattern(buf, seed) // written by the triggering goroutine, then triggered
				triggered <- condition.Trigger(h)
				<-hold // running until the buffer is reused (see the top of the file)
			}()
			require.NoError(t, rr.Wait(e.ctx))
			require.NoError(t, sr.Wait(e.ctx))
			require.Equal(t, patternSum(n, seed), crc32.ChecksumIEEE(got), "size %d: received data", n)
			fillPattern(buf, seed+1)
			close(hold)
			require.NoError(t, <-triggered)
		}
		require.NoError(t, cond.Destroy())
	})
}

// rawFlag is a word of C memory stored and loaded around the race detector (it does
// not see atomics on C memory: the bug these tests are about). The completion test
// uses it to hold a stream back until an operation completed without ordering
// anything the detector could see.
type rawFlag struct{ p *uint64 }

func newRawFlag(t *testing.T, b stream.Backend) rawFlag {
	t.Helper()
	words, err := b.AllocWords(1)
	require.NoError(t, err)
	t.Cleanup(func() { _ = words.Close() })
	// unsafe.Add, not a uintptr conversion: the address is C memory, never moved.
	return rawFlag{(*uint64)(unsafe.Add(unsafe.Pointer(nil), words.Word(0).HostPtr()))}
}

func (f rawFlag) set()        { atomic.StoreUint64(f.p, 1) }
func (f rawFlag) reset()      { atomic.StoreUint64(f.p, 0) }
func (f rawFlag) isSet() bool { return atomic.LoadUint64(f.p) == 1 }
func (f rawFlag) await(d time.Duration) bool {
	for deadline := time.Now().Add(d); !f.isSet(); runtime.Gosched() {
		if time.Now().After(deadline) {
			return false
		}
	}
	return true
}

// Engine completion store -> a stream's WaitValue and the host function after it: the
// test goroutine writes a payload after it enqueued the waiting stream's work (a wait
// for the first receive, then a host function reading the payload) and before it
// submits a second receive, so only the engine orders the write before the host
// function: the second submission hands it to the engine, the first receive's
// completion word hands it to the stream. The stream reaches its wait only after that
// completion (a flag the receive's callback sets), so it does not run the engine's
// round itself, which would order the write through the engine's lock.
func TestRaceOrderCompletionToStreamWait(t *testing.T) {
	e := newRaceOrderEnv(t)
	s := e.stream(t) // the condition's stream: triggers only
	b := e.stream(t) // waits for the first receive (Request.WaitOnStream)
	cond, err := condition.Create(condition.Param{Category: condition.Stream, Backend: e.backend, Stream: s})
	require.NoError(t, err)
	completed := newRawFlag(t, e.backend)
	for i, n := range raceOrderSizes {
		tag1, tag2, seed := uint64(0x7300+2*i), uint64(0x7301+2*i), byte(7*i+3)
		first := make([]byte, n)
		gate := make(chan struct{})
		require.NoError(t, s.LaunchHostFunc(func() { <-gate }))
		rr1, err := e.recvW.TagRecvNbx(first, tag1, ^uint64(0), &ucp.RequestParam{Condition: cond,
			Flags: ucp.NonBlockingEnqueue, Callback: func(*ucp.Request) { completed.set() }})
		require.NoError(t, err)

		payload := make([]byte, 512)
		var payloadSum, firstSum uint32
		reached := true
		require.NoError(t, b.LaunchHostFunc(func() { reached = completed.await(30 * time.Second) }))
		require.NoError(t, rr1.WaitOnStream(b))
		read := make(chan struct{})
		require.NoError(t, b.LaunchHostFunc(func() {
			payloadSum = readSum(payload)
			firstSum = readSum(first)
			close(read)
		}))

		// After b's work is enqueued: ordered before b's host function by the engine only.
		fillPattern(payload, seed)
		second, rr2 := func() ([]byte, *ucp.Request) {
			buf := make([]byte, n)
			r, err := e.recvW.TagRecvNbx(buf, tag2, ^uint64(0), &ucp.RequestParam{Condition: cond, Flags: ucp.NonBlockingEnqueue})
			require.NoError(t, err)
			return buf, r
		}()
		settle()
		close(gate)
		for k, tag := range []uint64{tag1, tag2} {
			msg := make([]byte, n)
			fillPattern(msg, seed+byte(k))
			sr, err := e.toRecv.TagSendNbx(msg, tag, nil)
			require.NoError(t, err)
			require.NoError(t, sr.Wait(e.ctx))
		}
		// Not b.Synchronize yet: a goroutine waiting on a stream tells its executor
		// how far it waits, which orders this goroutine's writes before the executor's
		// next operations.
		select {
		case <-read:
		case <-e.ctx.Done():
			t.Fatalf("size %d: the waiting stream never ran its host function", n)
		}
		require.NoError(t, b.Synchronize())
		require.True(t, reached, "size %d: the first receive's callback never ran", n)
		require.NoError(t, rr1.Wait(e.ctx))
		require.NoError(t, rr2.Wait(e.ctx))
		require.Equal(t, patternSum(len(payload), seed), payloadSum, "size %d: the stream's host function read the payload", n)
		require.Equal(t, patternSum(n, seed), firstSum, "size %d: first receive, read on the waiting stream", n)
		require.Equal(t, patternSum(n, seed+1), crc32.ChecksumIEEE(second), "size %d: second receive", n)
		completed.reset()
	}
	require.NoError(t, s.Synchronize())
	require.NoError(t, cond.Destroy())
}

// hostGraphComm adds a split communication step to g: a Graph condition whose start
// node stores the trigger and whose wait node completes once the engine fired it.
// The graph API of conditions is the part most likely to change: keep its use here.
func hostGraphComm(t *testing.T, b stream.Backend, g *graph.Host) (cond *condition.Condition, start, wait condition.Node) {
	t.Helper()
	cond, err := condition.Create(condition.Param{Category: condition.Graph, Backend: b, Graph: g, Split: true})
	require.NoError(t, err)
	return cond, cond.Node(), cond.WaitNode()
}

// Graph condition fired (completion word stored and notified) -> the host graph's
// wait node and the nodes after it: the send buffer, written before the operation was
// submitted, is written again by a task after the wait node. The graph launched and
// stored its trigger before that first write, so only the engine orders the two.
// A task between the start and the wait node holds the wait node back for a while,
// so the launch finds the word fired without waiting on its notification or running
// the engine's round itself.
func TestRaceOrderGraphFireToWaitNode(t *testing.T) {
	e := newRaceOrderEnv(t)
	s := e.stream(t)
	for i, n := range []int{64, 64 << 10} {
		tag, seed := uint64(0x7400+i), byte(11*i+5)
		g := graph.NewHost()
		cond, start, wait := hostGraphComm(t, e.backend, g)

		got, rr := e.recv(t, n, tag)
		arrived := make(chan error, 1)
		go func() { arrived <- rr.Wait(e.ctx) }()
		started := make(chan struct{})
		mid, err := g.AddTask([]condition.Node{start}, func() error {
			close(started)
			// Only time, nothing the detector sees: waiting for the receiver here would
			// order the launch after its calls into C, which the detector takes as
			// ordered after every earlier call into C, the engine's included.
			time.Sleep(50 * time.Millisecond)
			return nil
		})
		require.NoError(t, err)
		require.NoError(t, g.AddDependencies(mid, wait))
		buf := make([]byte, n)
		_, err = g.AddTask([]condition.Node{wait}, func() error {
			fillPattern(buf, seed+1) // the operation ran: reuse the send buffer
			return nil
		})
		require.NoError(t, err)
		x, err := g.Instantiate()
		require.NoError(t, err)
		require.NoError(t, x.Launch(s))

		<-started
		fillPattern(buf, seed)
		sr, err := e.toRecv.TagSendNbx(buf, tag, &ucp.RequestParam{Condition: cond})
		require.NoError(t, err)
		require.NoError(t, s.Synchronize())
		require.NoError(t, <-arrived)
		require.Equal(t, patternSum(n, seed), crc32.ChecksumIEEE(got), "size %d: received data", n)
		require.Equal(t, patternSum(n, seed+1), crc32.ChecksumIEEE(buf), "size %d: the task after the wait node reused the buffer", n)
		require.NoError(t, x.Close())
		require.NoError(t, g.Close())
		require.NoError(t, cond.Destroy())
		require.NoError(t, sr.Wait(e.ctx))
		require.NoError(t, cond.Err())
	}
}

// The reported case: a host function on the condition's stream writes the send
// buffer, the send is a NonBlockingEnqueue Stream-condition operation, and another
// stream waits for it with Request.WaitOnStream and reuses the buffer in a host
// function. Both signal words order the two writes: trigger then completion.
func TestRaceOrderWaitOnStreamBufferReuse(t *testing.T) {
	e := newRaceOrderEnv(t)
	a := e.stream(t)
	b := e.stream(t)
	cond, err := condition.Create(condition.Param{Category: condition.Stream, Backend: e.backend, Stream: a})
	require.NoError(t, err)
	for i, n := range raceOrderSizes {
		tag, seed := uint64(0x7500+i), byte(13*i+7)
		buf := make([]byte, n)
		got, rr := e.recv(t, n, tag)
		gate := make(chan struct{})
		require.NoError(t, a.LaunchHostFunc(func() {
			<-gate
			fillPattern(buf, seed)
		}))
		sr, err := e.toRecv.TagSendNbx(buf, tag, &ucp.RequestParam{Condition: cond, Flags: ucp.NonBlockingEnqueue})
		require.NoError(t, err)
		require.NoError(t, sr.WaitOnStream(b))
		require.NoError(t, b.LaunchHostFunc(func() { fillPattern(buf, seed+1) }))
		settle()
		close(gate)
		require.NoError(t, rr.Wait(e.ctx))
		require.NoError(t, b.Synchronize())
		require.Equal(t, patternSum(n, seed), crc32.ChecksumIEEE(got), "size %d: received data", n)
		require.Equal(t, patternSum(n, seed+1), crc32.ChecksumIEEE(buf), "size %d: the waiting stream reused the buffer", n)
		require.NoError(t, sr.Wait(e.ctx))
	}
	require.NoError(t, a.Synchronize())
	require.NoError(t, cond.Destroy())
}
