package tests

import (
	"encoding/binary"
	"testing"

	"github.com/ucpx/ucpx/cgo/cuda"
	"github.com/ucpx/ucpx/condition"
	"github.com/ucpx/ucpx/device"
	"github.com/ucpx/ucpx/graph"
	"github.com/ucpx/ucpx/stream"
	"github.com/ucpx/ucpx/ucp"
)

// CUDA graphs with communication nodes, each instantiated once and launched 1000 times
// with no host call per launch: sender [fill kernel -> send], receiver [memset 0 ->
// receive -> checksum kernel accumulating]. The accumulated checksum proves every
// launch delivered the whole payload.
func TestGPUGraphConditionRelaunch(t *testing.T) {
	g := requireGPU(t)
	recvW, _, toRecv, _ := shmWorkers(t)
	const n, launches, seed = 64 << 10, 1000, 7
	flags := cuda.HostAllocPortable | cuda.HostAllocDeviceMap
	out, err := g.ctx.MemHostAlloc(n, flags)
	must(t, err)
	defer out.Close()
	in, err := g.ctx.MemHostAlloc(n, flags)
	must(t, err)
	defer in.Close()
	acc, err := g.ctx.MemHostAlloc(8, flags)
	must(t, err)
	defer acc.Close()

	sg, err := g.ctx.NewGraph()
	must(t, err)
	defer sg.Close()
	fill, err := sg.AddKernelNode(nil, g.fill, cuda.Linear(64, 256), out.DevicePtr(), uint64(n), uint32(seed))
	must(t, err)
	send, err := condition.Create(condition.Param{Category: condition.Graph, Backend: g.backend, Graph: graph.CUDA{Graph: sg}, Deps: []any{fill}})
	must(t, err)
	_, err = toRecv.TagSendNbx(out.Bytes(), 5, &ucp.RequestParam{Condition: send})
	must(t, err)

	rg, err := g.ctx.NewGraph()
	must(t, err)
	defer rg.Close()
	clear, err := rg.AddMemsetNode(nil, in.DevicePtr(), 0, 1, n)
	must(t, err)
	recv, err := condition.Create(condition.Param{Category: condition.Graph, Backend: g.backend, Graph: graph.CUDA{Graph: rg}, Deps: []any{clear}})
	must(t, err)
	_, err = recvW.TagRecvNbx(in.Bytes(), 5, ^uint64(0), &ucp.RequestParam{Condition: recv})
	must(t, err)
	_, err = rg.AddKernelNode([]cuda.Node{recv.WaitNode().(cuda.Node)}, g.checksum, cuda.Linear(64, 256), in.DevicePtr(), uint64(n), acc.DevicePtr())
	must(t, err)

	sx, err := sg.Instantiate(0)
	must(t, err)
	defer sx.Close()
	rx, err := rg.Instantiate(0)
	must(t, err)
	defer rx.Close()
	ss, err := g.backend.NewStream()
	must(t, err)
	defer ss.Close()
	rs, err := g.backend.NewStream()
	must(t, err)
	defer rs.Close()
	scs, _ := stream.CUDAStream(ss)
	rcs, _ := stream.CUDAStream(rs)
	for i := 0; i < launches; i++ {
		must(t, rx.Launch(rcs))
		must(t, sx.Launch(scs))
	}
	must(t, ss.Synchronize())
	must(t, rs.Synchronize())
	var want uint64
	for i := uint64(0); i < n; i++ {
		want += uint64(device.Pattern(i, seed))
	}
	if got := binary.LittleEndian.Uint64(acc.Bytes()); got != launches*want {
		t.Fatalf("accumulated checksum %d over %d launches, want %d", got, launches, launches*want)
	}
	must(t, send.Err())
	must(t, recv.Err())
	must(t, sx.Close())
	must(t, rx.Close())
	must(t, send.Destroy())
	must(t, recv.Destroy())
}
