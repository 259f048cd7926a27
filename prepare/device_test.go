package prepare_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/prepare"
	"github.com/ucpx/ucpx/ucp"
)

// The host twins of ucpx_pready and ucpx_parrived run the device-side protocol on
// host streams: goroutines stand for thread blocks, one per partition on each side.

// fillPart writes partition [off, off+size) of buf as fill(buf, iter) would.
func fillPart(buf []byte, off, size, iter int) {
	for i := off; i < off+size; i++ {
		buf[i] = byte(iter*31 + i*7)
	}
}

// twinIteration runs one iteration through device handles: a "block" per receive
// partition waits with ParrivedHandle and checksums its partition, a "block" per send
// partition fills its partition and calls PreadyHandle, in the order given (each
// waits for the one before it in order), then both sides Wait.
func twinIteration(ctx context.Context, send, recv *prepare.Request, sbuf, rbuf []byte, iter int, order []int) error {
	if err := recv.Start(); err != nil {
		return err
	}
	rh, err := recv.DeviceHandle()
	if err != nil {
		return err
	}
	if err := send.Start(); err != nil {
		return err
	}
	sh, err := send.DeviceHandle()
	if err != nil {
		return err
	}
	if sh.Iteration != uint64(iter) || rh.Iteration != uint64(iter) {
		return fmt.Errorf("handles of iterations %d and %d in iteration %d", sh.Iteration, rh.Iteration, iter)
	}
	errs := make(chan error, sh.Partitions+rh.Partitions+2)
	var wg sync.WaitGroup
	for q := range rh.Partitions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				ok, err := prepare.ParrivedHandle(rh, q)
				if err != nil {
					errs <- err
					return
				}
				if ok {
					break
				}
				if ctx.Err() != nil {
					errs <- fmt.Errorf("receive partition %d: %w", q, ctx.Err())
					return
				}
			}
			errs <- checkSum(rbuf, q*rh.PartBytes, rh.PartBytes, iter)
		}()
	}
	turn := make([]chan struct{}, len(order)+1)
	for i := range turn {
		turn[i] = make(chan struct{})
	}
	close(turn[0])
	for k, p := range order {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer close(turn[k+1])
			fillPart(sbuf, p*sh.PartBytes, sh.PartBytes, iter)
			<-turn[k]
			errs <- prepare.PreadyHandle(sh, p)
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		errs <- send.Wait(ctx)
	}()
	stop := progressWhile(send.Worker())
	errs <- recv.Wait(ctx)
	stop()
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// progressWhile progresses w until stop is called. A put-with-signal's request
// completes once its data is out, and its signal add may still wait in the sender's
// UCX queue for the sender's progress: the sender's Wait can return before the
// receiver can see the partition arrive, and here the sender does nothing more until
// the receiver's Wait returns. (An application keeps progressing its worker, or gives
// it WorkerParams.ProgressThread.)
func progressWhile(w *ucp.Worker) (stop func()) {
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		for {
			select {
			case <-done:
				return
			default:
			}
			if w.Progress() == 0 {
				time.Sleep(5 * time.Microsecond)
			}
		}
	}()
	return func() {
		close(done)
		<-stopped
	}
}

// checkSum compares the checksum of partition [off, off+size) of buf with fill's, and
// the bytes themselves.
func checkSum(buf []byte, off, size, iter int) error {
	var sum, want uint64
	for i := off; i < off+size; i++ {
		sum += uint64(buf[i])
		want += uint64(byte(iter*31 + i*7))
	}
	if sum != want {
		return fmt.Errorf("iteration %d: bytes [%d, %d) sum to %d, want %d", iter, off, off+size, sum, want)
	}
	for i := off; i < off+size; i++ {
		if w := byte(iter*31 + i*7); buf[i] != w {
			return fmt.Errorf("iteration %d: byte %d is %d, want %d", iter, i, buf[i], w)
		}
	}
	return nil
}

func TestDeviceHandleTwins(t *testing.T) {
	links(t, func(t *testing.T, l *link) {
		for _, tc := range []partCase{
			{"1", 64, 1, 1, inOrder, 10},
			{"8x4k", 8 << 10 * 4, 8, 8, inOrder, 10},
			{"64 reverse", 64 * 128, 64, 64, reverse, 5},
			{"256 random", 256 * 16, 256, 256, random(2), 3},
			{"send 8 recv 4", 8 * 512, 8, 4, inOrder, 5},
			{"send 4 recv 8", 8 * 512, 4, 8, inOrder, 5},
			{"send 3 recv 6 random", 6 * 100, 3, 6, random(3), 5},
			// What the GPU test runs: many iterations, two sender partitions per
			// receive partition.
			{"send 64 recv 32 x100", 64 * 1024, 64, 32, inOrder, 100},
		} {
			t.Run(tc.name, func(t *testing.T) { tc.runTwins(t, l, 21, nil) })
		}
	})
}

// Iterations through device handles and through Pready alternate on one request pair.
func TestDeviceHandleMixedWithPready(t *testing.T) {
	l := shmLink(t)
	const parts = 8
	send, recv, sbuf, rbuf := pair(t, l, parts*256, parts, parts, 22)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for i := 1; i <= 6; i++ {
		if i%2 == 1 {
			require.NoError(t, twinIteration(ctx, send, recv, sbuf, rbuf, i, inOrder(parts)(i)))
			continue
		}
		iterate(t, send, recv, sbuf, rbuf, 1, inOrder(parts)) // checks the fill of iteration 1
	}
	require.Equal(t, uint64(6), send.Stats().Iterations)
}

// Early bird through device handles: with one partition held back, the others are
// reported arrived, the held one is not, and the iteration does not complete until
// it comes; the kernel-form handle carries what ucpx_partition_handle needs.
func TestDeviceHandleEarlyBird(t *testing.T) {
	l := shmLink(t)
	const parts, size, held = 16, 256, 5
	send, recv, sbuf, rbuf := pair(t, l, parts*size, parts, parts/2, 23)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	require.NoError(t, recv.Start())
	require.NoError(t, send.Start())
	rh, err := recv.DeviceHandle()
	require.NoError(t, err)
	sh, err := send.DeviceHandle()
	require.NoError(t, err)

	k := sh.Kernel()
	require.NotZero(t, k.Words)
	require.NotZero(t, k.Triggers)
	require.EqualValues(t, 1, k.Iteration)
	require.EqualValues(t, 1, k.TriggerValue)
	require.EqualValues(t, parts, k.Partitions)
	require.EqualValues(t, size, k.PartBytes)
	require.EqualValues(t, 2*size, k.PeerPartBytes)
	k = rh.Kernel()
	require.Zero(t, k.Triggers, "a receiver's handle has no triggers")
	require.EqualValues(t, parts/2, k.Partitions)
	require.EqualValues(t, 2*size, k.PartBytes)
	require.EqualValues(t, size, k.PeerPartBytes)
	require.Equal(t, sh.Failed, rh.Failed)

	// The same iteration's handle again: nothing armed twice.
	again, err := send.DeviceHandle()
	require.NoError(t, err)
	require.Equal(t, sh.Kernel(), again.Kernel())
	require.Equal(t, uint64(parts), send.Stats().Puts)

	fill(sbuf, 1)
	for p := range parts {
		if p != held {
			require.NoError(t, prepare.PreadyHandle(sh, p))
		}
	}
	heldQ := held / 2
	for q := range parts / 2 {
		if q == heldQ {
			continue
		}
		require.Eventually(t, func() bool {
			ok, err := prepare.ParrivedHandle(rh, q)
			require.NoError(t, err)
			return ok
		}, 10*time.Second, 10*time.Microsecond, "receive partition %d", q)
		require.NoError(t, checkSum(rbuf, q*2*size, 2*size, 1))
	}
	time.Sleep(10 * time.Millisecond)
	ok, err := prepare.ParrivedHandle(rh, heldQ)
	require.NoError(t, err)
	require.False(t, ok, "the partition covering the held one arrived")
	done, err := recv.Test()
	require.NoError(t, err)
	require.False(t, done)
	done, err = send.Test()
	require.NoError(t, err)
	require.False(t, done, "the sender's iteration completed with a partition not ready")
	require.NoError(t, prepare.PreadyHandle(sh, held))
	go func() { _ = send.Wait(ctx) }()
	require.NoError(t, recv.Wait(ctx))
	require.NoError(t, checkFilled(rbuf, 1))
	ok, err = prepare.ParrivedHandle(rh, heldQ)
	require.NoError(t, err)
	require.True(t, ok)
}

func TestDeviceHandleBadInput(t *testing.T) {
	l := shmLink(t)
	const parts = 4
	send, recv, sbuf, rbuf := pair(t, l, parts*64, parts, parts, 24)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err := send.DeviceHandle()
	require.ErrorIs(t, err, ucp.ErrInvalidParam, "sender before Start")
	_, err = recv.DeviceHandle()
	require.ErrorIs(t, err, ucp.ErrInvalidParam, "receiver before Start")
	require.ErrorIs(t, prepare.PreadyHandle(prepare.DeviceHandle{}, 0), ucp.ErrInvalidParam, "zero handle")
	_, err = prepare.ParrivedHandle(prepare.DeviceHandle{}, 0)
	require.ErrorIs(t, err, ucp.ErrInvalidParam, "zero handle")

	// Iteration 1 from the host: a device handle is refused once a partition is ready.
	require.NoError(t, recv.Start())
	require.NoError(t, send.Start())
	fill(sbuf, 1)
	require.NoError(t, send.Pready(0))
	_, err = send.DeviceHandle()
	require.ErrorIs(t, err, ucp.ErrInvalidParam, "device handle after Pready")
	require.NoError(t, send.PreadyRange(1, parts-1))
	go func() { _ = send.Wait(ctx) }()
	require.NoError(t, recv.Wait(ctx))
	require.NoError(t, send.Wait(ctx))
	_, err = send.DeviceHandle()
	require.ErrorIs(t, err, ucp.ErrInvalidParam, "device handle of a completed host iteration")

	// Iteration 2 through handles.
	require.NoError(t, recv.Start())
	require.NoError(t, send.Start())
	sh, err := send.DeviceHandle()
	require.NoError(t, err)
	rh, err := recv.DeviceHandle()
	require.NoError(t, err)
	require.ErrorIs(t, send.Pready(0), ucp.ErrInvalidParam, "Pready after the device handle armed the iteration")
	require.ErrorIs(t, prepare.PreadyHandle(rh, 0), ucp.ErrInvalidParam, "pready with a receiver's handle")
	_, err = prepare.ParrivedHandle(sh, 0)
	require.ErrorIs(t, err, ucp.ErrInvalidParam, "parrived with a sender's handle")
	require.ErrorIs(t, prepare.PreadyHandle(sh, parts), ucp.ErrInvalidParam, "out of range")
	require.ErrorIs(t, prepare.PreadyHandle(sh, -1), ucp.ErrInvalidParam, "negative")
	_, err = prepare.ParrivedHandle(rh, parts)
	require.ErrorIs(t, err, ucp.ErrInvalidParam, "out of range")
	fill(sbuf, 2)
	for p := range parts {
		require.NoError(t, prepare.PreadyHandle(sh, p))
	}
	require.ErrorIs(t, prepare.PreadyHandle(sh, 1), ucp.ErrInvalidParam, "twice in one iteration")
	require.ErrorIs(t, send.Free(), ucp.ErrBusy, "free in flight")
	go func() { _ = send.Wait(ctx) }()
	require.NoError(t, recv.Wait(ctx))
	require.NoError(t, send.Wait(ctx))
	require.NoError(t, checkFilled(rbuf, 2))

	// Iteration 3: the handles of iteration 2 are stale.
	require.NoError(t, recv.Start())
	require.NoError(t, send.Start())
	require.ErrorIs(t, prepare.PreadyHandle(sh, 0), ucp.ErrInvalidParam, "stale sender handle")
	_, err = prepare.ParrivedHandle(rh, 0)
	require.ErrorIs(t, err, ucp.ErrInvalidParam, "stale receiver handle")
	require.NoError(t, twinAfterStart(ctx, send, recv, sbuf, rbuf, 3))
	require.NoError(t, send.Free())
	require.NoError(t, recv.Free())
	require.ErrorIs(t, prepare.PreadyHandle(sh, 0), ucp.ErrClosed, "freed")
}

// twinAfterStart finishes an iteration both sides started, through device handles.
func twinAfterStart(ctx context.Context, send, recv *prepare.Request, sbuf, rbuf []byte, iter int) error {
	sh, err := send.DeviceHandle()
	if err != nil {
		return err
	}
	fill(sbuf, iter)
	for p := range sh.Partitions {
		if err := prepare.PreadyHandle(sh, p); err != nil {
			return err
		}
	}
	errc := make(chan error, 1)
	go func() { errc <- send.Wait(ctx) }()
	if err := recv.Wait(ctx); err != nil {
		return err
	}
	if err := <-errc; err != nil {
		return err
	}
	return checkFilled(rbuf, iter)
}

// A dead peer releases the host twins as it releases kernels: goroutines waiting in
// PreadyHandle (the receiver never started) and receive "blocks" polling
// ParrivedHandle for a partition that never comes get errors matching
// ucp.ErrPeerFailed, Wait reports it, and Free succeeds (the armed puts were canceled).
func TestDeviceHandlePeerFails(t *testing.T) {
	t.Run("sender waits, receiver dies (tcp)", func(t *testing.T) {
		l := tcpLink(t)
		const parts = 8
		send, _, _, _ := pair(t, l, parts*128, parts, parts, 25)
		require.NoError(t, send.Start())
		sh, err := send.DeviceHandle()
		require.NoError(t, err)
		errs := make(chan error, parts)
		for p := range parts {
			go func() { errs <- prepare.PreadyHandle(sh, p) }()
		}
		time.Sleep(20 * time.Millisecond)
		require.NoError(t, l.r.Close()) // the receiver's worker goes away
		for range parts {
			select {
			case err := <-errs:
				require.ErrorIs(t, err, ucp.ErrPeerFailed)
			case <-time.After(20 * time.Second):
				t.Fatal("PreadyHandle still waits for a dead receiver")
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		require.ErrorIs(t, send.Wait(ctx), ucp.ErrPeerFailed)
		_, err = send.DeviceHandle()
		require.ErrorIs(t, err, ucp.ErrPeerFailed)
		require.NoError(t, send.Free())
	})
	t.Run("receiver waits, sender dies (tcp)", func(t *testing.T) {
		l := tcpLink(t)
		const parts = 8
		send, recv, sbuf, rbuf := pair(t, l, parts*128, parts, parts, 26)
		sh, rh := startWithHandles(t, send, recv)
		fill(sbuf, 1)
		const held = 3
		for p := range parts {
			if p != held {
				require.NoError(t, prepare.PreadyHandle(sh, p))
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		for q := range parts {
			if q == held {
				continue
			}
			for {
				ok, err := prepare.ParrivedHandle(rh, q)
				require.NoError(t, err)
				if ok {
					break
				}
				_, _ = send.Test()
				require.NoError(t, ctx.Err(), "partition %d never arrived", q)
			}
			require.NoError(t, checkSum(rbuf, q*128, 128, 1))
		}
		polled := make(chan error, 1)
		go func() {
			for {
				ok, err := prepare.ParrivedHandle(rh, held)
				if ok || err != nil {
					polled <- err
					return
				}
			}
		}()
		time.Sleep(20 * time.Millisecond)
		require.NoError(t, l.s.Close()) // the sender's worker goes away
		select {
		case err := <-polled:
			require.ErrorIs(t, err, ucp.ErrPeerFailed)
		case <-ctx.Done():
			t.Fatal("ParrivedHandle still reports nothing for a dead sender")
		}
		require.ErrorIs(t, recv.Wait(ctx), ucp.ErrPeerFailed)
		require.NoError(t, recv.Free())
	})
	t.Run("failure value (injected)", func(t *testing.T) {
		l := shmLink(t)
		const parts = 4
		send, recv, _, _ := pair(t, l, parts*64, parts, parts, 27)
		sh, rh := startWithHandles(t, send, recv)
		require.NoError(t, prepare.PreadyHandle(sh, 0)) // flags are set; partition 0 moves
		injected := fmt.Errorf("injected: %w", ucp.ErrPeerFailed)
		prepare.Fail(send, injected)
		prepare.Fail(recv, injected)
		for p := 1; p < parts; p++ {
			require.ErrorIs(t, prepare.PreadyHandle(sh, p), ucp.ErrPeerFailed)
		}
		for q := range parts {
			_, err := prepare.ParrivedHandle(rh, q)
			require.ErrorIs(t, err, ucp.ErrPeerFailed)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		require.ErrorIs(t, send.Wait(ctx), ucp.ErrPeerFailed)
		require.ErrorIs(t, recv.Wait(ctx), ucp.ErrPeerFailed)
		require.NoError(t, send.Free(), "the armed puts were canceled")
		require.NoError(t, recv.Free())
	})
}

// startWithHandles starts an iteration on both sides, the receiver first, and fetches
// both device handles.
func startWithHandles(t *testing.T, send, recv *prepare.Request) (sh, rh prepare.DeviceHandle) {
	t.Helper()
	require.NoError(t, recv.Start())
	rh, err := recv.DeviceHandle()
	require.NoError(t, err)
	require.NoError(t, send.Start())
	sh, err = send.DeviceHandle()
	require.NoError(t, err)
	return sh, rh
}
