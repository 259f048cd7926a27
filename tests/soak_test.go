package tests

import (
	"context"
	"encoding/binary"
	"hash/crc32"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/ucp"
)

// TestSoak sends UCPX_SOAK_MESSAGES checksummed messages (default 20000; `make soak`
// sends a million) over each transport, 64 in flight, and checks every one arrives
// once, in order, intact.
func TestSoak(t *testing.T) {
	n := 20000
	if v := os.Getenv("UCPX_SOAK_MESSAGES"); v != "" {
		var err error
		n, err = strconv.Atoi(v)
		require.NoError(t, err)
	}
	if testing.Short() {
		n = min(n, 2000)
	}
	for _, transport := range []string{"shm", "tcp"} {
		t.Run(transport, func(t *testing.T) { soak(t, transport, n) })
	}
}

func soak(t *testing.T, transport string, n int) {
	key := []byte("soak test key, 32 bytes long....")
	var cfg map[string]string
	if transport == "tcp" {
		cfg = map[string]string{"TLS": "tcp"}
	}
	ca, err := ucp.NewContext(ucp.ContextParams{Config: cfg, AuthKey: key})
	require.NoError(t, err)
	defer ca.Close()
	cb, err := ucp.NewContext(ucp.ContextParams{Config: cfg, AuthKey: key})
	require.NoError(t, err)
	defer cb.Close()
	wa, err := ca.NewWorker(ucp.WorkerParams{})
	require.NoError(t, err)
	wb, err := cb.NewWorker(ucp.WorkerParams{})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	var ep *ucp.Endpoint
	if transport == "tcp" {
		l, err := wb.Listen("127.0.0.1:0", nil)
		require.NoError(t, err)
		connected := make(chan struct{})
		go func() {
			_, _ = l.Accept(ctx, nil)
			for { // Connect's wire-up needs the server's progress
				select {
				case <-connected:
					return
				default:
					wb.Progress()
				}
			}
		}()
		ep, err = wa.Connect(ctx, l.Addr(), nil)
		close(connected)
		require.NoError(t, err)
	} else {
		addr, err := wb.Address()
		require.NoError(t, err)
		ep, err = wa.ConnectAddress(addr, &ucp.EndpointParams{NoPeerErrorHandling: true})
		require.NoError(t, err)
	}
	const window = 64
	msg := func(i int) []byte {
		size := 16 + (i*7919)%4000
		b := make([]byte, size)
		binary.LittleEndian.PutUint64(b, uint64(i))
		for k := 12; k < size; k++ {
			b[k] = byte(i + k)
		}
		binary.LittleEndian.PutUint32(b[8:], crc32.ChecksumIEEE(b[12:]))
		return b
	}
	type slot struct {
		buf  []byte
		recv *ucp.Request
		send *ucp.Request
	}
	slots := make([]slot, window)
	post := func(i int) {
		s := &slots[i%window]
		s.buf = make([]byte, 4096)
		var err error
		s.recv, err = wb.TagRecvNbx(s.buf, 0, 0, nil) // any tag: order is checked by content
		require.NoError(t, err)
		s.send, err = ep.TagSendNbx(msg(i), uint64(i), nil)
		require.NoError(t, err)
	}
	for i := 0; i < window && i < n; i++ {
		post(i)
	}
	for i := 0; i < n; i++ {
		s := &slots[i%window]
		for !s.recv.Done() || !s.send.Done() {
			wa.Progress()
			wb.Progress()
			require.NoError(t, ctx.Err())
		}
		require.NoError(t, s.recv.Err())
		require.NoError(t, s.send.Err())
		b := s.buf[:s.recv.Length()]
		require.Equal(t, uint64(i), binary.LittleEndian.Uint64(b), "message out of order, lost or duplicated")
		require.Equal(t, crc32.ChecksumIEEE(b[12:]), binary.LittleEndian.Uint32(b[8:]), "message %d corrupted", i)
		if i+window < n {
			post(i + window)
		}
	}
}
