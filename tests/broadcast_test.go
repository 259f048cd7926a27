package tests

import (
	"context"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/ucpx/ucpx/condition"
	"github.com/ucpx/ucpx/graph"
	"github.com/ucpx/ucpx/stream"
	"github.com/ucpx/ucpx/ucp"
)

// The proposal's broadcast node set across three processes, as host graphs:
//
//	A (root):   fill -> send(to B);  recv(echo from B) -> check
//	B (middle): parent -> recv(from A) -> send1(to C), send2(to A)    <- the proposal's shape
//	C (leaf):   recv(from B) -> check
//
// Each process instantiates its graph once and launches it bcastLaunches times; every
// launch carries a different payload and every receiver checks it.
const (
	bcastLaunches = 1000
	bcastSize     = 8192
	tagAToB       = 0xB0
	tagBToC       = 0xB1
	tagBToA       = 0xB2
	tagHelloB     = 0xB3
	tagHelloC     = 0xB4
	tagAddrOfC    = 0xB5
	envBcastA     = "UCPX_TEST_BCAST_A"
)

func bcastPayload(buf []byte, launch uint64) {
	for i := range buf {
		buf[i] = byte(launch*131 + uint64(i))
	}
}

func bcastCheck(buf []byte, launch uint64) error {
	for i := range buf {
		if buf[i] != byte(launch*131+uint64(i)) {
			return fmt.Errorf("launch %d: byte %d is %d", launch, i, buf[i])
		}
	}
	return nil
}

func graphOp(g *graph.Host, backend stream.Backend, deps []any) (*condition.Condition, error) {
	return condition.Create(condition.Param{Category: condition.Graph, Backend: backend, Graph: g, Deps: deps})
}

func TestBroadcastGraphThreeProcesses(t *testing.T) {
	uctx, err := ucp.NewContext(ucp.ContextParams{})
	must(t, err)
	defer uctx.Close()
	w, err := uctx.NewWorker(ucp.WorkerParams{})
	must(t, err)
	self, err := w.Address()
	must(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()

	var outs [2]strings.Builder
	children := make([]*exec.Cmd, 2)
	exits := make([]chan error, 2)
	for i, role := range []string{"bcast-b", "bcast-c"} {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), envRole+"="+role, envBcastA+"="+hex.EncodeToString(self))
		cmd.Stdout, cmd.Stderr = &outs[i], &outs[i]
		must(t, cmd.Start())
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
		must(t, err)
		if err := r.Wait(ctx); err != nil {
			t.Fatalf("hello %#x: %v\nB:\n%s\nC:\n%s", tag, err, &outs[0], &outs[1])
		}
		return buf[:r.Length()]
	}
	noPeerErr := &ucp.EndpointParams{NoPeerErrorHandling: true}
	toB, err := w.ConnectAddress(recvAddr(tagHelloB), noPeerErr)
	must(t, err)
	addrC := recvAddr(tagHelloC)
	must(t, send(ctx, toB, addrC, tagAddrOfC)) // B connects to C itself

	backend := stream.NewHostBackend()
	defer backend.Close()
	out, echo := make([]byte, bcastSize), make([]byte, bcastSize)
	var launch uint64
	g := graph.NewHost()
	fill, _ := g.AddTask(nil, func() error { launch++; bcastPayload(out, launch); return nil })
	sendB, err := graphOp(g, backend, []any{fill})
	must(t, err)
	_, err = toB.TagSendNbx(out, tagAToB, &ucp.RequestParam{Condition: sendB})
	must(t, err)
	recvEcho, err := graphOp(g, backend, []any{fill})
	must(t, err)
	_, err = w.TagRecvNbx(echo, tagBToA, ^uint64(0), &ucp.RequestParam{Condition: recvEcho})
	must(t, err)
	_, err = g.AddTask([]*graph.HostNode{recvEcho.Node().(*graph.HostNode), sendB.Node().(*graph.HostNode)},
		func() error { return bcastCheck(echo, launch) })
	must(t, err)
	x, err := g.Instantiate()
	must(t, err)
	s, err := backend.NewStream()
	must(t, err)
	start := time.Now()
	for i := 0; i < bcastLaunches; i++ {
		must(t, x.Launch(s))
	}
	if err := s.Synchronize(); err != nil {
		t.Fatalf("root graph: %v\nB:\n%s\nC:\n%s", err, &outs[0], &outs[1])
	}
	t.Logf("%d launches of the broadcast in %v", bcastLaunches, time.Since(start))
	for i, ch := range exits {
		select {
		case err := <-ch:
			if err != nil {
				t.Fatalf("process %c: %v\n%s", 'B'+i, err, &outs[i])
			}
		case <-ctx.Done():
			t.Fatalf("process %c did not finish\n%s", 'B'+i, &outs[i])
		}
	}
	must(t, x.Close())
	must(t, sendB.Err())
	must(t, recvEcho.Err())
}

// runBroadcastPeer is process B or C of the broadcast.
func runBroadcastPeer(role string) error {
	uctx, err := ucp.NewContext(ucp.ContextParams{})
	if err != nil {
		return err
	}
	defer uctx.Close()
	w, err := uctx.NewWorker(ucp.WorkerParams{})
	if err != nil {
		return err
	}
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
	backend := stream.NewHostBackend()
	defer backend.Close()
	buf := make([]byte, bcastSize)
	var launch uint64
	g := graph.NewHost()
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
		parent, _ := g.AddTask(nil, func() error { launch++; return nil })
		recv, err := graphOp(g, backend, []any{parent})
		if err != nil {
			return err
		}
		if _, err := w.TagRecvNbx(buf, tagAToB, ^uint64(0), &ucp.RequestParam{Condition: recv}); err != nil {
			return err
		}
		check, _ := g.AddTask([]*graph.HostNode{recv.Node().(*graph.HostNode)}, func() error { return bcastCheck(buf, launch) })
		send1, err := graphOp(g, backend, []any{check})
		if err != nil {
			return err
		}
		if _, err := toC.TagSendNbx(buf, tagBToC, &ucp.RequestParam{Condition: send1}); err != nil {
			return err
		}
		send2, err := graphOp(g, backend, []any{check})
		if err != nil {
			return err
		}
		if _, err := toA.TagSendNbx(buf, tagBToA, &ucp.RequestParam{Condition: send2}); err != nil {
			return err
		}
	} else {
		recv, err := graphOp(g, backend, nil)
		if err != nil {
			return err
		}
		if _, err := w.TagRecvNbx(buf, tagBToC, ^uint64(0), &ucp.RequestParam{Condition: recv}); err != nil {
			return err
		}
		if _, err := g.AddTask([]*graph.HostNode{recv.Node().(*graph.HostNode)}, func() error {
			launch++
			return bcastCheck(buf, launch)
		}); err != nil {
			return err
		}
	}
	x, err := g.Instantiate()
	if err != nil {
		return err
	}
	s, err := backend.NewStream()
	if err != nil {
		return err
	}
	for i := 0; i < bcastLaunches; i++ {
		if err := x.Launch(s); err != nil {
			return err
		}
	}
	if err := s.Synchronize(); err != nil {
		return fmt.Errorf("%s graph: %w", role, err)
	}
	if launch != bcastLaunches {
		return fmt.Errorf("%s ran %d launches", role, launch)
	}
	// Let the last sends' data drain before the worker goes away.
	f, err := w.FlushNbx(nil)
	if err == nil {
		err = f.Wait(ctx)
	}
	return err
}
