package tests

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/condition"
	"github.com/ucpx/ucpx/trace"
	"github.com/ucpx/ucpx/ucp"
)

// Traced stream-ordered receives of 64 KiB on a CUDA stream wait for their completion
// with the stamping poll kernel: every receive gets its device track's two spans (the
// stream at the poll until the poll saw completion; the engine's store until the
// device saw it), the device saw no completion before the engine stored it, and the
// summary has both device phases.
func TestGPUTraceDeviceStamps(t *testing.T) {
	g := requireGPU(t)
	recvW, _, toRecv, _ := shmWorkers(t)
	rec := trace.NewRecorder()
	require.NoError(t, recvW.Trace(rec))
	s := g.stream(t)
	cond, err := condition.Create(condition.Param{Category: condition.Stream, Backend: g.backend, Stream: s})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	const n, iters = 64 << 10, 40
	buf := make([]byte, n)
	for it := range iters {
		want := pattern(n, byte(it))
		rr, err := recvW.TagRecvNbx(buf, uint64(it), ^uint64(0), &ucp.RequestParam{Condition: cond})
		require.NoError(t, err)
		sr, err := toRecv.TagSendNbx(want, uint64(it), nil)
		require.NoError(t, err)
		require.NoError(t, sr.Wait(ctx))
		require.NoError(t, rr.Wait(ctx))
		require.NoError(t, s.Synchronize())
		require.Equal(t, byteSum(want), byteSum(buf), "iteration %d", it)
	}
	require.NoError(t, cond.Destroy()) // synchronizes, then hands the last stamps over
	require.NoError(t, recvW.Trace(nil))

	var out bytes.Buffer
	require.NoError(t, rec.WriteJSON(&out))
	f, err := trace.ReadFile(&out)
	require.NoError(t, err)
	stores := map[uint64]float64{} // seq -> host store, µs
	waits, sees := map[uint64][2]float64{}, map[uint64]float64{}
	clock := ""
	for _, ev := range f.TraceEvents {
		if ev.Ph == "M" && ev.Tid >= trace.DeviceTrack {
			clock = ev.Args["name"].(string)
			continue
		}
		if ev.Ph != "X" {
			continue
		}
		seq := uint64(ev.Args["seq"].(float64))
		switch {
		case ev.Tid < trace.DeviceTrack && ev.Name == trace.PhaseStore:
			stores[seq] = ev.Ts + ev.Dur
		case ev.Name == trace.PhaseDeviceWait:
			require.GreaterOrEqual(t, ev.Dur, 0.0)
			waits[seq] = [2]float64{ev.Ts, ev.Ts + ev.Dur}
		case ev.Name == trace.PhaseDeviceSees:
			sees[seq] = ev.Dur
		}
	}
	require.Len(t, stores, iters)
	require.Len(t, waits, iters, "a device wait span per receive")
	require.Len(t, sees, iters)
	require.True(t, strings.Contains(clock, trace.ClockWall) || strings.Contains(clock, trace.ClockAligned), "device track name %q", clock)
	const slack = 0.002 // µs: JSON rounding
	for seq, w := range waits {
		require.GreaterOrEqual(t, w[1]+slack, stores[seq], "seq %d: the device saw the completion before the engine stored it", seq)
	}
	sum := trace.Summarize(f)
	require.Equal(t, iters, sum.Ops, "device spans are not operations of their own")
	found := map[string]int{}
	for _, p := range sum.Phases {
		found[p.Phase] = p.Count
	}
	require.Equal(t, iters, found[trace.PhaseDeviceWait])
	require.Equal(t, iters, found[trace.PhaseDeviceSees])
	t.Logf("%s\n%s", clock, sum)
}
