package protocol_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/internal/testenv"
	"github.com/ucpx/ucpx/protocol"
	"github.com/ucpx/ucpx/stream"
)

// The protocol's handles answer a nil receiver, zero arguments and extreme integers
// (a reservation of 2^63 buffers, a lend of -1 bytes) with errors or zero values: no
// panic, no hang, no allocation of what the machine does not have.
func TestHandlesTakeBadArguments(t *testing.T) {
	testenv.NilMethods(t, (*protocol.Planner)(nil), (*protocol.Workspace)(nil), (*protocol.Pool)(nil),
		(*protocol.IPCExporter)(nil), (*protocol.IPCImporter)(nil), (*protocol.Buffer)(nil), (*protocol.Stats)(nil))

	b := stream.NewHostBackend()
	defer b.Close()
	pl, err := protocol.NewPlanner(protocol.DefaultConfig(), false)
	require.NoError(t, err)
	defer pl.Close()
	ws, err := protocol.NewWorkspace(b, 1<<20)
	require.NoError(t, err)
	defer ws.Close()
	pool := protocol.NewPool(b)
	defer pool.Close()
	buf, err := pool.Get(4096)
	require.NoError(t, err)
	defer pool.Put(buf)
	handles := []any{pl, ws, pool, protocol.NewIPCExporter(nil), protocol.NewIPCImporter(nil), buf, &protocol.Stats{}}
	skip := map[string]bool{"Close": true, "Put": true}
	testenv.ZeroArgs(t, skip, handles...)
	testenv.ExtremeArgs(t, skip, handles...)

	require.ErrorIs(t, pl.Prepare(nil), protocol.ErrInvalidParam, "a nil backend")
	require.ErrorIs(t, pl.Plan(protocol.Transfer{}, protocol.Route{Backend: b}, nil), protocol.ErrInvalidParam, "no plan to fill")
	require.ErrorIs(t, pool.Reserve(64, -1), protocol.ErrInvalidParam)
	require.ErrorIs(t, pool.Reserve(64, 1<<40), protocol.ErrInvalidParam, "more buffers than a reservation holds")
	// A buffer put back twice is lent once.
	twice, err := pool.Get(4096)
	require.NoError(t, err)
	lent := pool.Lent()
	pool.Put(twice)
	pool.Put(twice)
	require.Equal(t, lent-1, pool.Lent())
	first, err := pool.Get(4096)
	require.NoError(t, err)
	second, err := pool.Get(4096)
	require.NoError(t, err)
	require.NotSame(t, first, second)
	pool.Put(first)
	pool.Put(second)
	for _, n := range []int{0, -1, 1<<62 + 1} {
		_, err := pool.Get(n)
		require.ErrorIs(t, err, protocol.ErrInvalidParam, "a buffer of %d bytes", n)
		_, _, err = pool.Lend(n, nil)
		require.ErrorIs(t, err, protocol.ErrInvalidParam, "a loan of %d bytes", n)
		require.ErrorIs(t, pool.Reserve(n, 2), protocol.ErrInvalidParam, "a reservation of %d bytes", n)
	}
	_, err = protocol.NewWorkspace(b, -1)
	require.ErrorIs(t, err, protocol.ErrInvalidParam)
	_, err = protocol.NewWorkspace(b, 1<<62)
	require.Error(t, err, "more memory than the machine has")
	_, _, err = protocol.LendHost(ws, pool, -1, protocol.Out, nil, nil)
	require.ErrorIs(t, err, protocol.ErrInvalidParam)
	_, _, err = protocol.LendHost(ws, pool, 1<<62, protocol.Out, nil, nil)
	require.Error(t, err, "more memory than the machine has")
}
