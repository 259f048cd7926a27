package tests

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/cgo/cuda"
	"github.com/ucpx/ucpx/condition"
	"github.com/ucpx/ucpx/device"
	"github.com/ucpx/ucpx/graph"
	"github.com/ucpx/ucpx/stream"
	"github.com/ucpx/ucpx/ucp"
)

// The proposal's broadcast node set across three processes:
//
//	A (root):   produce -> send(to B);  clear -> recv(echo from B) -> check
//	B (middle): parent -> recv(from A) -> send1(to C), send2(to A)    <- the proposal's shape
//	            (recv -> check as well)
//	C (leaf):   clear -> recv(from B) -> check
//
// Each process instantiates its graph once and launches it bcastLaunches times. With
// host graphs every launch carries a different payload and every receiver compares it
// byte for byte; with CUDA graphs the receiving graph clears its buffer, receives, and
// a checksum kernel adds the buffer's sum on the device at every launch, so the final
// sum equals launches × the payload's sum only if every launch delivered it whole.
const (
	bcastLaunches = 1000
	bcastSize     = 8192
	bcastSeed     = 11
	tagAToB       = 0xB0
	tagBToC       = 0xB1
	tagBToA       = 0xB2
	tagHelloB     = 0xB3
	tagHelloC     = 0xB4
	tagAddrOfC    = 0xB5
	envBcastA     = "UCPX_TEST_BCAST_A"
	envBcastKind  = "UCPX_TEST_BCAST_KIND"
)

func TestBroadcastGraphThreeProcesses(t *testing.T) { bcastRoot(t, stream.KindHost) }

func TestGPUBroadcastCUDAGraphsThreeProcesses(t *testing.T) {
	requireGPU(t)
	bcastRoot(t, stream.KindCUDA)
}

// bcastGraph builds one process's broadcast graph, of host or CUDA kind.
type bcastGraph interface {
	buffer() []byte
	// produce adds the node writing the launch's payload into buf.
	produce(buf []byte) (condition.Node, error)
	// clear adds the node that resets buf before a receive (nil where not needed).
	clear(buf []byte) (condition.Node, error)
	// comm adds a communication node after deps.
	comm(deps ...condition.Node) (*condition.Condition, error)
	// check adds the node verifying buf after deps.
	check(buf []byte, deps ...condition.Node) error
	// run instantiates, launches n times, synchronizes and verifies every check.
	run(n int) error
	close()
}

func newBcastGraph(kind stream.Kind) (bcastGraph, error) {
	if kind == stream.KindHost {
		return newHostBcast(), nil
	}
	return newCUDABcast()
}

// bcastRoot is process A; B and C are this test binary run again (runBroadcastPeer).
func bcastRoot(t *testing.T, kind stream.Kind) {
	uctx, err := ucp.NewContext(ucp.ContextParams{})
	require.NoError(t, err)
	defer uctx.Close()
	w, err := uctx.NewWorker(ucp.WorkerParams{})
	require.NoError(t, err)
	self, err := w.Address()
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()

	var outs [2]childOutput
	children := make([]*exec.Cmd, 2)
	exits := make([]chan error, 2)
	for i, role := range []string{"bcast-b", "bcast-c"} {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), envRole+"="+role, envBcastA+"="+hex.EncodeToString(self), envBcastKind+"="+kind.String())
		cmd.Stdout, cmd.Stderr = &outs[i], &outs[i]
		require.NoError(t, cmd.Start())
		children[i] = cmd
		exits[i] = make(chan error, 1)
		go func(i int) { exits[i] <- cmd.Wait() }(i)
	}
	defer func() {
		for _, c := range children {
			_ = c.Process.Kill()
		}
	}()
	recvAddr := func(tag uint64) []byte {
		buf := make([]byte, 4096)
		r, err := w.TagRecvNbx(buf, tag, ^uint64(0), nil)
		require.NoError(t, err)
		require.NoError(t, r.Wait(ctx), "hello %#x\nB:\n%s\nC:\n%s", tag, &outs[0], &outs[1])
		return buf[:r.Length()]
	}
	noPeerErr := &ucp.EndpointParams{NoPeerErrorHandling: true}
	toB, err := w.ConnectAddress(recvAddr(tagHelloB), noPeerErr)
	require.NoError(t, err)
	addrC := recvAddr(tagHelloC)
	require.NoError(t, send(ctx, toB, addrC, tagAddrOfC)) // B connects to C itself

	g, err := newBcastGraph(kind)
	require.NoError(t, err)
	defer g.close()
	out, echo := g.buffer(), g.buffer()
	produced, err := g.produce(out)
	require.NoError(t, err)
	sendB, err := g.comm(produced)
	require.NoError(t, err)
	_, err = toB.TagSendNbx(out, tagAToB, &ucp.RequestParam{Condition: sendB})
	require.NoError(t, err)
	cleared, err := g.clear(echo)
	require.NoError(t, err)
	recvEcho, err := g.comm(cleared)
	require.NoError(t, err)
	_, err = w.TagRecvNbx(echo, tagBToA, ^uint64(0), &ucp.RequestParam{Condition: recvEcho})
	require.NoError(t, err)
	require.NoError(t, g.check(echo, recvEcho.WaitNode(), sendB.WaitNode()))
	start := time.Now()
	require.NoError(t, g.run(bcastLaunches), "root graph\nB:\n%s\nC:\n%s", &outs[0], &outs[1])
	t.Logf("%d launches of the broadcast (%s graphs) in %v", bcastLaunches, kind, time.Since(start))
	for i, ch := range exits {
		select {
		case err := <-ch:
			require.NoError(t, err, "process %c\n%s", 'B'+i, &outs[i])
		case <-ctx.Done():
			require.FailNowf(t, "peer did not finish", "process %c did not finish\n%s", 'B'+i, &outs[i])
		}
	}
	require.NoError(t, sendB.Err())
	require.NoError(t, recvEcho.Err())
	g.close()
	require.NoError(t, sendB.Destroy())
	require.NoError(t, recvEcho.Destroy())
}

// runBroadcastPeer is process B or C of the broadcast.
func runBroadcastPeer(role string) error {
	kind := stream.KindHost
	if os.Getenv(envBcastKind) == stream.KindCUDA.String() {
		kind = stream.KindCUDA
	}
	uctx, w, err := peerWorker(nil)
	if err != nil {
		return err
	}
	defer uctx.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Second)
	defer cancel()
	rootAddr, err := hex.DecodeString(os.Getenv(envBcastA))
	if err != nil {
		return err
	}
	noPeerErr := &ucp.EndpointParams{NoPeerErrorHandling: true}
	toA, err := w.ConnectAddress(rootAddr, noPeerErr)
	if err != nil {
		return err
	}
	self, err := w.Address()
	if err != nil {
		return err
	}
	hello := uint64(tagHelloB)
	if role == "bcast-c" {
		hello = tagHelloC
	}
	if err := send(ctx, toA, self, hello); err != nil {
		return err
	}
	g, err := newBcastGraph(kind)
	if err != nil {
		return err
	}
	defer g.close()
	buf := g.buffer()
	var conds []*condition.Condition
	if role == "bcast-b" {
		addrBuf := make([]byte, 4096)
		r, err := w.TagRecvNbx(addrBuf, tagAddrOfC, ^uint64(0), nil)
		if err == nil {
			err = r.Wait(ctx)
		}
		if err != nil {
			return err
		}
		toC, err := w.ConnectAddress(addrBuf[:r.Length()], noPeerErr)
		if err != nil {
			return err
		}
		// The proposal's node set: recv depends on a parent; send1 and send2 on recv.
		parent, err := g.clear(buf)
		if err != nil {
			return err
		}
		recv, err := g.comm(parent)
		if err != nil {
			return err
		}
		if _, err := w.TagRecvNbx(buf, tagAToB, ^uint64(0), &ucp.RequestParam{Condition: recv}); err != nil {
			return err
		}
		if err := g.check(buf, recv.WaitNode()); err != nil {
			return err
		}
		send1, err := g.comm(recv.WaitNode())
		if err != nil {
			return err
		}
		if _, err := toC.TagSendNbx(buf, tagBToC, &ucp.RequestParam{Condition: send1}); err != nil {
			return err
		}
		send2, err := g.comm(recv.WaitNode())
		if err != nil {
			return err
		}
		if _, err := toA.TagSendNbx(buf, tagBToA, &ucp.RequestParam{Condition: send2}); err != nil {
			return err
		}
		conds = append(conds, recv, send1, send2)
	} else {
		cleared, err := g.clear(buf)
		if err != nil {
			return err
		}
		recv, err := g.comm(cleared)
		if err != nil {
			return err
		}
		if _, err := w.TagRecvNbx(buf, tagBToC, ^uint64(0), &ucp.RequestParam{Condition: recv}); err != nil {
			return err
		}
		if err := g.check(buf, recv.WaitNode()); err != nil {
			return err
		}
		conds = append(conds, recv)
	}
	if err := g.run(bcastLaunches); err != nil {
		return fmt.Errorf("%s graph: %w", role, err)
	}
	for _, c := range conds {
		if err := c.Err(); err != nil {
			return err
		}
	}
	// Let the last sends' data drain before the worker goes away.
	f, err := w.FlushNbx(nil)
	if err == nil {
		err = f.Wait(ctx)
	}
	return err
}

// hostBcast: host graphs; the payload changes every launch and checks compare bytes.
// The graph's first node counts the launches; producing and clearing follow it.
type hostBcast struct {
	backend stream.Backend
	g       *graph.Host
	start   *graph.HostNode
	x       *graph.HostExec
	launch  uint64
}

func newHostBcast() *hostBcast {
	h := &hostBcast{backend: stream.NewHostBackend(), g: graph.NewHost()}
	h.start, _ = h.g.AddTask(nil, func() error { h.launch++; return nil })
	return h
}

func (h *hostBcast) buffer() []byte { return make([]byte, bcastSize) }

func (h *hostBcast) produce(buf []byte) (condition.Node, error) {
	return h.g.AddTask([]condition.Node{h.start}, func() error {
		for i := range buf {
			buf[i] = byte(h.launch*131 + uint64(i))
		}
		return nil
	})
}

func (h *hostBcast) clear(buf []byte) (condition.Node, error) {
	return h.g.AddTask([]condition.Node{h.start}, func() error { clear(buf); return nil })
}

func (h *hostBcast) comm(deps ...condition.Node) (*condition.Condition, error) {
	return condition.Create(condition.Param{Category: condition.Graph, Backend: h.backend, Graph: h.g, Deps: deps})
}

func (h *hostBcast) check(buf []byte, deps ...condition.Node) error {
	_, err := h.g.AddTask(deps, func() error {
		for i := range buf {
			if buf[i] != byte(h.launch*131+uint64(i)) {
				return fmt.Errorf("launch %d: byte %d is %d", h.launch, i, buf[i])
			}
		}
		return nil
	})
	return err
}

func (h *hostBcast) run(n int) error {
	var err error
	if h.x, err = h.g.Instantiate(); err != nil {
		return err
	}
	s, err := h.backend.NewStream()
	if err != nil {
		return err
	}
	defer s.Close()
	for i := 0; i < n; i++ {
		if err := h.x.Launch(s); err != nil {
			return err
		}
	}
	if err := s.Synchronize(); err != nil {
		return err
	}
	if h.launch != uint64(n) {
		return fmt.Errorf("ran %d launches of %d", h.launch, n)
	}
	return nil
}

func (h *hostBcast) close() {
	if h.x != nil {
		_ = h.x.Close()
		h.x = nil
	}
	_ = h.backend.Close()
}

// cudaBcast: CUDA graphs; buffers are pinned host memory mapped into the device, the
// payload is the fill kernel's pattern, checks are checksum kernels into device sums.
type cudaBcast struct {
	backend stream.Backend
	ctx     *cuda.Context
	module  *cuda.Module
	fill    *cuda.Function
	sum     *cuda.Function
	g       *cuda.Graph
	x       *cuda.GraphExec
	mems    []*cuda.HostMemory
	sums    []*cuda.HostMemory // one per check node, pinned host-mapped
}

func newCUDABcast() (*cudaBcast, error) {
	b, err := stream.Open(stream.CUDA)
	if err != nil {
		return nil, err
	}
	ctx, _, _ := stream.CUDAContext(b)
	c := &cudaBcast{backend: b, ctx: ctx}
	if c.module, err = ctx.LoadModule(device.TestKernelsPTX()); err == nil {
		if c.fill, err = c.module.Function(device.KernelFill); err == nil {
			c.sum, err = c.module.Function(device.KernelChecksum)
		}
	}
	if err == nil {
		c.g, err = ctx.NewGraph()
	}
	if err != nil {
		c.close()
		return nil, err
	}
	return c, nil
}

func (c *cudaBcast) hostMapped(n int) (*cuda.HostMemory, error) {
	m, err := c.ctx.MemHostAlloc(n, cuda.HostAllocPortable|cuda.HostAllocDeviceMap)
	if err == nil {
		c.mems = append(c.mems, m)
	}
	return m, err
}

func (c *cudaBcast) mapped(buf []byte) uintptr {
	for _, m := range c.mems {
		if len(m.Bytes()) > 0 && &m.Bytes()[0] == &buf[0] {
			return m.DevicePtr()
		}
	}
	panic("buffer not from cudaBcast.buffer")
}

func (c *cudaBcast) buffer() []byte {
	m, err := c.hostMapped(bcastSize)
	if err != nil {
		panic(err) // only in the test's own setup
	}
	return m.Bytes()
}

// nodes drops the nil dependencies (a root) and converts the rest for cgo/cuda's calls.
func nodes(deps []condition.Node) []cuda.Node {
	var kept []condition.Node
	for _, d := range deps {
		if d != nil {
			kept = append(kept, d)
		}
	}
	out, err := graph.CUDANodes(kept...)
	if err != nil {
		panic(err) // only the test's own nodes reach here
	}
	return out
}

func (c *cudaBcast) produce(buf []byte) (condition.Node, error) {
	return c.g.AddKernelNode(nil, c.fill, cuda.Linear(8, 256), c.mapped(buf), uint64(len(buf)), uint32(bcastSeed))
}

func (c *cudaBcast) clear(buf []byte) (condition.Node, error) {
	return c.g.AddMemsetNode(nil, c.mapped(buf), 0, 1, len(buf))
}

func (c *cudaBcast) comm(deps ...condition.Node) (*condition.Condition, error) {
	var ds []condition.Node
	for _, n := range nodes(deps) {
		ds = append(ds, n)
	}
	return condition.Create(condition.Param{Category: condition.Graph, Backend: c.backend, Graph: graph.CUDA{Graph: c.g}, Deps: ds})
}

func (c *cudaBcast) check(buf []byte, deps ...condition.Node) error {
	sum, err := c.hostMapped(8)
	if err != nil {
		return err
	}
	c.sums = append(c.sums, sum)
	_, err = c.g.AddKernelNode(nodes(deps), c.sum, cuda.Linear(8, 256), c.mapped(buf), uint64(len(buf)), sum.DevicePtr())
	return err
}

func (c *cudaBcast) run(n int) error {
	var err error
	if c.x, err = c.g.Instantiate(0); err != nil {
		return err
	}
	s, err := c.backend.NewStream()
	if err != nil {
		return err
	}
	defer s.Close()
	cs, _ := stream.CUDAStream(s)
	for i := 0; i < n; i++ {
		if err := c.x.Launch(cs); err != nil {
			return err
		}
	}
	if err := s.Synchronize(); err != nil {
		return err
	}
	want := uint64(n) * fillSum(bcastSize, bcastSeed)
	for i, sum := range c.sums {
		if got := binary.LittleEndian.Uint64(sum.Bytes()); got != want {
			return fmt.Errorf("check %d: device checksum over %d launches %d, want %d", i, n, got, want)
		}
	}
	return nil
}

func (c *cudaBcast) close() {
	if c.x != nil {
		_ = c.x.Close()
		c.x = nil
	}
	if c.g != nil {
		_ = c.g.Close()
		c.g = nil
	}
	for _, m := range c.mems {
		_ = m.Close()
	}
	c.mems = nil
	if c.module != nil {
		_ = c.module.Close()
		c.module = nil
	}
	if c.backend != nil {
		_ = c.backend.Close()
		c.backend = nil
	}
}
