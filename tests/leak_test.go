package tests

import (
	"context"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/ucp"
)

func openFDs(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	return len(ents)
}

// Create/destroy cycles of authenticated connections (handshake, endpoints, sealed
// rkeys, revocation) leave no goroutine, file descriptor or UCX handle behind.
func TestLeakCreateDestroyCycles(t *testing.T) {
	cycles := 30
	if testing.Short() {
		cycles = 10
	}
	key := []byte("leak test key, 32 bytes long....")
	require.True(t, ucp.Live().Zero(), "%+v", ucp.Live())
	oneCycle(t, key) // warm-up: lazily started runtime goroutines and fds
	g0, fd0 := runtime.NumGoroutine(), openFDs(t)
	for i := 0; i < cycles; i++ {
		oneCycle(t, key)
	}
	require.True(t, ucp.Live().Zero(), "%+v", ucp.Live())
	deadline := time.Now().Add(10 * time.Second)
	for (runtime.NumGoroutine() > g0 || openFDs(t) > fd0) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if g := runtime.NumGoroutine(); g > g0 {
		buf := make([]byte, 1<<20)
		t.Fatalf("goroutines: %d before, %d after %d cycles:\n%s", g0, g, cycles, buf[:runtime.Stack(buf, true)])
	}
	require.LessOrEqual(t, openFDs(t), fd0, "file descriptors left open")
}

func oneCycle(t *testing.T, key []byte) {
	cfg := map[string]string{"TLS": "tcp"}
	ca, err := ucp.NewContext(ucp.ContextParams{Config: cfg, AuthKey: key})
	require.NoError(t, err)
	cb, err := ucp.NewContext(ucp.ContextParams{Config: cfg, AuthKey: key})
	require.NoError(t, err)
	wa, err := ca.NewWorker(ucp.WorkerParams{})
	require.NoError(t, err)
	wb, err := cb.NewWorker(ucp.WorkerParams{})
	require.NoError(t, err)
	l, err := wb.Listen("127.0.0.1:0", nil)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	accepted := make(chan *ucp.Endpoint, 1)
	stop := make(chan struct{})
	go func() {
		ep, err := l.Accept(ctx, nil)
		if err != nil {
			accepted <- nil
			return
		}
		accepted <- ep
		for {
			select {
			case <-stop:
				return
			default:
				wb.Progress()
			}
		}
	}()
	epA, err := wa.Connect(ctx, l.Addr(), nil)
	require.NoError(t, err)
	epB := <-accepted
	require.NotNil(t, epB)
	m, err := cb.MemAlloc(4096)
	require.NoError(t, err)
	packed, err := m.PackRkey()
	require.NoError(t, err)
	rk, err := epA.UnpackRkey(packed)
	require.NoError(t, err)
	r, err := epA.PutNbx([]byte("leak"), rk.Base(), rk, nil)
	require.NoError(t, err)
	require.NoError(t, r.Wait(ctx))
	require.NoError(t, rk.Close())
	close(stop)
	require.NoError(t, m.Close())
	require.NoError(t, l.Close())
	require.NoError(t, ca.Close())
	require.NoError(t, cb.Close())
}
