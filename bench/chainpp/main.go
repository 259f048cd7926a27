// Command chainpp is the chained ping-pong across two processes: each side's loop is a
// condition.Chain (initiator [send] [receive], responder [receive] [send]), so every
// operation is posted from the UCX completion callback of the one before, in C. It is
// ucx_perftest's tag_lat with the loop moved into chains, and bench/vs-ucx-perftest.sh
// runs the two back to back.
//
//	chainpp [-p port] [-s size] [-n iters] [-w warmup] [-e]         # responder (server)
//	chainpp [-p port] [-s size] [-n iters] [-w warmup] [-e] HOST    # initiator
//
// Both sides exchange worker addresses over a TCP connection to port, as ucx_perftest
// does; UCX_TLS selects the transports. -e turns peer error handling on (tcp), as
// ucx_perftest -e. Buffers are registered and their memory handles passed (as -z).
// The initiator prints one line: the median one-way latency of the last 2048
// iterations in µs (ucx_perftest's "typical"), then p50 and p99 of those iterations and
// the average over all, each the round trip halved.
package main

import (
	"context"
	"encoding/binary"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"time"

	"github.com/ucpx/ucpx/condition"
	"github.com/ucpx/ucpx/ucp"
)

func main() {
	port := flag.Int("p", 13337, "TCP port of the address exchange")
	size := flag.Int("s", 8, "message size in bytes")
	iters := flag.Uint64("n", 50000, "measured iterations")
	warmup := flag.Uint64("w", 2000, "warm-up iterations")
	peerErr := flag.Bool("e", false, "peer error handling on the endpoint")
	timeout := flag.Duration("timeout", 2*time.Minute, "give up after this long")
	flag.Parse()
	if err := run(flag.Arg(0), *port, *size, *iters, *warmup, *peerErr, *timeout); err != nil {
		fmt.Fprintln(os.Stderr, "chainpp:", err)
		os.Exit(1)
	}
}

func run(host string, port, size int, iters, warmup uint64, peerErr bool, timeout time.Duration) error {
	if size <= 0 || iters == 0 {
		return fmt.Errorf("-s and -n must be positive")
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	// Tag matching only, no wakeup: the waits poll, as ucx_perftest's do.
	uctx, err := ucp.NewContext(ucp.ContextParams{Features: ucp.FeatureTag})
	if err != nil {
		return err
	}
	defer uctx.Close()
	w, err := uctx.NewWorker(ucp.WorkerParams{NoWakeup: true})
	if err != nil {
		return err
	}
	self, err := w.Address()
	if err != nil {
		return err
	}
	peer, err := exchange(host, port, self)
	if err != nil {
		return fmt.Errorf("address exchange: %w", err)
	}
	ep, err := w.ConnectAddress(peer, &ucp.EndpointParams{NoPeerErrorHandling: !peerErr})
	if err != nil {
		return err
	}
	sm, err := uctx.MemAlloc(size)
	if err != nil {
		return err
	}
	defer sm.Close()
	rm, err := uctx.MemAlloc(size)
	if err != nil {
		return err
	}
	defer rm.Close()
	initiator := host != ""
	build := func(n uint64) (*condition.Chain, error) {
		c, err := condition.NewChain(condition.ChainParam{Repeat: n})
		if err != nil {
			return nil, err
		}
		send := func() error {
			_, err := ep.TagSendNbx(sm.Bytes(), tag(initiator), &ucp.RequestParam{Chain: c, MemH: sm})
			return err
		}
		recv := func() error {
			_, err := w.TagRecvNbx(rm.Bytes(), tag(!initiator), ^uint64(0), &ucp.RequestParam{Chain: c, MemH: rm})
			return err
		}
		first, second := recv, send
		if initiator {
			first, second = send, recv
		}
		if err := first(); err != nil {
			return nil, err
		}
		if err := c.Then(); err != nil {
			return nil, err
		}
		return c, second()
	}
	var c *condition.Chain
	var elapsed time.Duration
	for _, n := range []uint64{warmup, iters} {
		if n == 0 {
			continue
		}
		if c, err = build(n); err != nil {
			return err
		}
		start := time.Now()
		if err := c.Start(); err != nil {
			return err
		}
		if err := c.Wait(ctx); err != nil {
			return err
		}
		elapsed = time.Since(start)
		if n != iters {
			if err := c.Destroy(); err != nil {
				return err
			}
		}
	}
	defer c.Destroy()
	if initiator {
		t := c.IterationTimes()
		slices.Sort(t)
		if len(t) == 0 {
			return fmt.Errorf("no iteration times")
		}
		half := func(d time.Duration) float64 { return d.Seconds() * 1e6 / 2 }
		p := func(q float64) time.Duration { return t[min(len(t)-1, int(q*float64(len(t))))] }
		fmt.Printf("chain_lat_last2048_us %.4f p50_us %.4f p99_us %.4f avg_us %.4f iters %d\n",
			half(median(t)), half(p(0.50)), half(p(0.99)), half(elapsed/time.Duration(iters)), c.Iterations())
	}
	// Let the last send leave before the worker goes away.
	f, err := w.FlushNbx(nil)
	if err == nil {
		err = f.Wait(ctx)
	}
	return err
}

func tag(initiator bool) uint64 {
	if initiator {
		return 1
	}
	return 2
}

func median(sorted []time.Duration) time.Duration {
	n := len(sorted)
	if n%2 == 1 {
		return sorted[n/2]
	}
	return (sorted[n/2-1] + sorted[n/2]) / 2
}

// exchange swaps worker addresses with the peer: the responder listens on port, the
// initiator connects to host:port (retrying while the responder starts).
func exchange(host string, port int, self []byte) ([]byte, error) {
	var conn net.Conn
	if host == "" {
		l, err := net.Listen("tcp", fmt.Sprintf(":%d", port))
		if err != nil {
			return nil, err
		}
		conn, err = l.Accept()
		l.Close()
		if err != nil {
			return nil, err
		}
	} else {
		var err error
		for try := 0; ; try++ {
			conn, err = net.Dial("tcp", net.JoinHostPort(host, fmt.Sprint(port)))
			if err == nil {
				break
			}
			if try == 100 {
				return nil, err
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	defer conn.Close()
	out := binary.BigEndian.AppendUint32(nil, uint32(len(self)))
	if _, err := conn.Write(append(out, self...)); err != nil {
		return nil, err
	}
	var n [4]byte
	if _, err := io.ReadFull(conn, n[:]); err != nil {
		return nil, err
	}
	size := binary.BigEndian.Uint32(n[:])
	if size > 1<<20 {
		return nil, fmt.Errorf("peer's address of %d bytes: not a UCX worker address", size)
	}
	peer := make([]byte, size)
	_, err := io.ReadFull(conn, peer)
	return peer, err
}
