package graph_test

import (
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/condition"
	"github.com/ucpx/ucpx/graph"
	"github.com/ucpx/ucpx/internal/testenv/fakeipc"
	"github.com/ucpx/ucpx/protocol"
	"github.com/ucpx/ucpx/stream"
	"github.com/ucpx/ucpx/ucp"
)

// Graph conditions on device buffers (declared MemoryCUDA) have no stream to stage
// on: with ContextParams.Device the engine issues each launch's operation as the call
// with no condition, staged through the device's stream (StageAlways: to a peer CUDA
// IPC reaches the message would be pulled, below). A sender graph [fill -> send] and
// a receiver graph [recv -> check] on fake device memory, relaunched, the data checked
// at every launch; then the same with the message pulled.
func TestGraphConditionDeviceBuffers(t *testing.T) {
	dev := fakeipc.New(stream.NewHostBackend(), [16]byte{0xd1})
	t.Cleanup(func() { _ = dev.Close() })
	for _, staging := range []protocol.Staging{protocol.StageAlways, protocol.StageWhenNeeded} {
		graphDeviceBuffers(t, dev, staging)
	}
}

func graphDeviceBuffers(t *testing.T, dev *fakeipc.Device, staging protocol.Staging) {
	l := newLinkWith(t, ucp.ContextParams{Device: dev})
	var err error
	const launches, n = 200, 4096
	outMem, inMem := fakeipc.Malloc(n), fakeipc.Malloc(n)
	defer outMem.Free()
	defer inMem.Free()
	out, in := outMem.Bytes(), inMem.Bytes()
	var launch uint64
	sg := graph.NewHost()
	fill, _ := sg.AddTask(nil, func() error {
		launch++
		for i := range out {
			out[i] = byte(launch*3 + uint64(i))
		}
		return nil
	})
	send := graphCondition(t, l, sg, []condition.Node{fill}, false)
	_, err = l.ab.TagSendNbx(ucp.DeviceBuffer(outMem.Ptr(), n), 9, &ucp.RequestParam{Condition: send, MemoryType: ucp.MemoryCUDA, Staging: staging})
	require.NoError(t, err)

	rg := graph.NewHost()
	recv := graphCondition(t, l, rg, nil, false)
	_, err = l.b.TagRecvNbx(ucp.DeviceBuffer(inMem.Ptr(), n), 9, ^uint64(0), &ucp.RequestParam{Condition: recv, MemoryType: ucp.MemoryCUDA})
	require.NoError(t, err)
	var checked atomic.Int64
	_, err = rg.AddTask([]condition.Node{recv.Node()}, func() error {
		k := uint64(checked.Add(1))
		for i := range in {
			if in[i] != byte(k*3+uint64(i)) {
				return fmt.Errorf("launch %d: byte %d is %d, want %d", k, i, in[i], byte(k*3+uint64(i)))
			}
		}
		return nil
	})
	require.NoError(t, err)
	launchPair(t, l, sg, rg, send, recv, launches, &checked)
	if staging == protocol.StageAlways {
		require.NotZero(t, l.a.StagingStats().Bytes, "staged through the device")
	} else {
		require.Zero(t, l.a.StagingStats().Bytes, "pulled: the sender staged nothing")
	}
}
