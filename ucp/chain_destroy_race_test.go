package ucp

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/condition"
)

// Chain.Wait (parked or looping), Start, Test, Iterations and Err racing Chain.Destroy
// must not touch the freed C chain. The race detector does not see C memory: run with
// -asan, which reported a heap-use-after-free in (*Chain).Detached/SetParked
// (chainRunner.park) and (*Chain).Result (chainRunner.Wait, Iterations, Err).
func TestChainCallsRacingDestroy(t *testing.T) {
	_, w, _ := selfLoop(t, WorkerParams{})
	for i := range 200 {
		ch, err := condition.NewChain(condition.ChainParam{})
		require.NoError(t, err)
		_, err = w.TagRecvNbx(make([]byte, 8), 1, ^uint64(0), &RequestParam{Chain: ch})
		require.NoError(t, err)
		require.NoError(t, ch.Start())
		var wg sync.WaitGroup
		wg.Add(4)
		waited := make(chan error, 1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			waited <- ch.Wait(ctx)
		}()
		go func() {
			defer wg.Done()
			for range 2000 {
				_ = ch.Iterations()
				_ = ch.Err()
			}
		}()
		go func() {
			defer wg.Done()
			for range 200 {
				// The receive never matches: the run goes on until Destroy.
				if err := ch.Start(); !errors.Is(err, ErrBusy) && !errors.Is(err, condition.ErrDestroyed) {
					t.Errorf("Start of a running or destroyed chain: %v", err)
				}
				_, _ = ch.Test()
			}
		}()
		go func() {
			defer wg.Done()
			time.Sleep(time.Duration(i%10) * 20 * time.Microsecond)
			require.NoError(t, ch.Destroy())
		}()
		wg.Wait()
		require.ErrorIs(t, <-waited, condition.ErrDestroyed)
	}
}
