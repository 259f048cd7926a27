package tests

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"hash/crc32"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/ucp"
)

// The test binary re-executes itself as the peer process: TestMain runs the role named
// in UCPX_TEST_ROLE instead of the tests.

const (
	envRole       = "UCPX_TEST_ROLE"
	envTransport  = "UCPX_TEST_TRANSPORT"
	envListenAddr = "UCPX_TEST_LISTEN_ADDR"
	envWorkerAddr = "UCPX_TEST_WORKER_ADDR"

	tagHello    = 1 << 44 // peer -> parent: the peer's worker address (shm)
	tagRkey     = 2 << 44 // peer -> parent: packed rkey of the peer's region
	tagQuit     = 3 << 44 // parent -> peer: exit 0
	tagDie      = 4 << 44 // parent -> peer: exit at once, closing nothing
	tagChecksum = 5 << 44 // parent -> peer: reply with crc32 of region[:n]
	tagReply    = 1 << 47 // peer echoes data tags with this bit set

	amEcho  = 7
	amReply = 8

	peerRegion = 4 << 20
	maxMsg     = 16 << 20
)

func TestMain(m *testing.M) {
	if role := os.Getenv(envRole); role != "" {
		if err := runPeer(role); err != nil {
			fmt.Fprintln(os.Stderr, "peer:", err)
			os.Exit(2)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func contextConfig(transport string) map[string]string {
	if transport == "tcp" {
		return map[string]string{"TLS": "tcp"}
	}
	return nil
}

// peerWorker opens a peer process's UCX context (with config) and its one worker;
// closing the context closes the worker.
func peerWorker(config map[string]string) (*ucp.Context, *ucp.Worker, error) {
	uctx, err := ucp.NewContext(ucp.ContextParams{Config: config})
	if err != nil {
		return nil, nil, err
	}
	w, err := uctx.NewWorker(ucp.WorkerParams{})
	if err != nil {
		_ = uctx.Close()
		return nil, nil, err
	}
	return uctx, w, nil
}

// runPeer is the peer process: connect, publish a registered region, then echo.
func runPeer(role string) error {
	if role == "bcast-b" || role == "bcast-c" {
		return runBroadcastPeer(role)
	}
	if role == "ring" {
		return runRingChild()
	}
	if role == "ipc-peer" {
		return runIPCPeer()
	}
	if role == "ipc-exporter" {
		return runIPCExporter()
	}
	if role == "psend" {
		return runPartitionedSender()
	}
	if role != "echo" {
		return fmt.Errorf("unknown role %q", role)
	}
	transport := os.Getenv(envTransport)
	uctx, w, err := peerWorker(contextConfig(transport))
	if err != nil {
		return err
	}
	defer uctx.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	var ep *ucp.Endpoint
	if transport == "tcp" {
		ep, err = w.Connect(ctx, os.Getenv(envListenAddr), nil)
		if err != nil {
			return err
		}
	} else {
		parent, err := hex.DecodeString(os.Getenv(envWorkerAddr))
		if err != nil {
			return err
		}
		ep, err = w.ConnectAddress(parent, &ucp.EndpointParams{NoPeerErrorHandling: true})
		if err != nil {
			return err
		}
		self, err := w.Address()
		if err != nil {
			return err
		}
		if err := send(ctx, ep, self, tagHello); err != nil {
			return err
		}
	}
	region, err := uctx.MemAlloc(peerRegion)
	if err != nil {
		return err
	}
	packed, err := region.PackRkey()
	if err != nil {
		return err
	}
	if err := send(ctx, ep, packed, tagRkey); err != nil {
		return err
	}
	if err := w.SetAmHandler(amEcho, func(m *ucp.AmMessage) {
		data := make([]byte, m.Length())
		r, err := m.RecvData(data, nil)
		if err == nil {
			err = r.Wait(ctx)
		}
		if err == nil {
			_, err = ep.AmSendNbx(amReply, m.Header, data, &ucp.RequestParam{Flags: ucp.NoImmediateCompletion, Callback: func(*ucp.Request) { _ = data }})
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "peer am echo:", err)
		}
	}); err != nil {
		return err
	}
	buf := make([]byte, maxMsg)
	for {
		r, err := w.TagRecvNbx(buf, 0, 0, &ucp.RequestParam{Peer: ep})
		if err != nil {
			return err
		}
		if err := r.Wait(ctx); err != nil {
			return err
		}
		tag, n := r.SenderTag(), r.Length()
		switch tag {
		case tagQuit:
			f, err := ep.FlushNbx(nil)
			if err == nil {
				_ = f.Wait(ctx)
			}
			return nil
		case tagDie:
			os.Exit(3)
		case tagChecksum:
			size := int(binary.LittleEndian.Uint64(buf[:8]))
			sum := crc32.ChecksumIEEE(region.Bytes()[:size])
			var out [4]byte
			binary.LittleEndian.PutUint32(out[:], sum)
			if err := send(ctx, ep, out[:], tagChecksum|tagReply); err != nil {
				return err
			}
		default:
			if err := send(ctx, ep, buf[:n], tag|tagReply); err != nil {
				return err
			}
		}
	}
}

func send(ctx context.Context, ep *ucp.Endpoint, b []byte, tag uint64) error {
	r, err := ep.TagSendNbx(b, tag, nil)
	if err != nil {
		return err
	}
	return r.Wait(ctx)
}

// peer is the parent's view of a spawned peer process.
type peer struct {
	t    testing.TB
	ctx  *ucp.Context
	w    *ucp.Worker
	ep   *ucp.Endpoint
	rkey *ucp.Rkey
	cmd  *exec.Cmd
	// exited is closed once the process was waited for; waitErr is its result. The
	// waiting goroutine owns cmd.ProcessState, so nothing else reads it.
	exited  chan struct{}
	waitErr error
	out     *childOutput
	epErr   chan error
}

func spawnPeer(t testing.TB, transport string) *peer {
	t.Helper()
	p := &peer{t: t, exited: make(chan struct{}), out: &childOutput{}, epErr: make(chan error, 1)}
	var err error
	p.ctx, err = ucp.NewContext(ucp.ContextParams{Config: contextConfig(transport)})
	require.NoError(t, err)
	p.w, err = p.ctx.NewWorker(ucp.WorkerParams{})
	require.NoError(t, err)
	epParams := &ucp.EndpointParams{ErrorHandler: func(_ *ucp.Endpoint, err error) { p.epErr <- err }}

	p.cmd = exec.Command(os.Args[0], "-test.run=^$")
	p.cmd.Env = append(os.Environ(), envRole+"=echo", envTransport+"="+transport)
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var l *ucp.Listener
	if transport == "tcp" {
		l, err = p.w.Listen("127.0.0.1:0", nil)
		require.NoError(t, err)
		p.cmd.Env = append(p.cmd.Env, envListenAddr+"="+l.Addr())
	} else {
		self, err := p.w.Address()
		require.NoError(t, err)
		p.cmd.Env = append(p.cmd.Env, envWorkerAddr+"="+hex.EncodeToString(self))
	}
	require.NoError(t, p.cmd.Start())
	go func() {
		p.waitErr = p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(p.close)

	if transport == "tcp" {
		p.ep, err = l.Accept(ctx, epParams)
		require.NoError(t, err)
		require.NoError(t, l.Close())
	} else {
		addr := p.recv(ctx, tagHello, 4096)
		p.ep, err = p.w.ConnectAddress(addr, &ucp.EndpointParams{NoPeerErrorHandling: true})
		require.NoError(t, err)
	}
	packed := p.recv(ctx, tagRkey, 4096)
	p.rkey, err = p.ep.UnpackRkey(packed)
	require.NoError(t, err)
	return p
}

func (p *peer) recv(ctx context.Context, tag uint64, max int) []byte {
	p.t.Helper()
	buf := make([]byte, max)
	r, err := p.w.TagRecvNbx(buf, tag, ^uint64(0), nil)
	require.NoError(p.t, err)
	require.NoError(p.t, r.Wait(ctx), "receive tag %#x\npeer output:\n%s", tag, p.out)
	return buf[:r.Length()]
}

// exit waits for the peer process to end and returns what cmd.Wait returned.
func (p *peer) exit() error {
	<-p.exited
	return p.waitErr
}

func (p *peer) close() {
	select {
	case <-p.exited:
	default:
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if p.ep != nil && p.ep.Err() == nil {
			if r, err := p.ep.TagSendNbx(nil, tagQuit, nil); err == nil {
				_ = r.Wait(ctx)
			}
		}
		// The peer flushes before it exits, which needs this side's progress.
		deadline := time.Now().Add(10 * time.Second)
	wait:
		for {
			select {
			case <-p.exited:
				break wait
			default:
				p.w.Progress()
				if time.Now().After(deadline) {
					assert.Failf(p.t, "peer did not exit after quit", "output:\n%s", p.out)
					_ = p.cmd.Process.Kill()
					<-p.exited
					break wait
				}
			}
		}
	}
	require.NoError(p.t, p.ctx.Close())
}

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	x := uint32(seed) + 1
	for i := range b {
		x = x*1664525 + 1013904223
		b[i] = byte(x >> 24)
	}
	return b
}

func TestTwoProcesses(t *testing.T) {
	for _, transport := range []string{"tcp", "shm"} {
		t.Run(transport, func(t *testing.T) {
			p := spawnPeer(t, transport)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()

			// Tagged echo, eager through rendezvous, checksummed.
			for i, n := range []int{0, 1, 8, 4096, 65536, 1 << 20, maxMsg} {
				src := pattern(n, byte(i))
				tag := uint64(1000 + i)
				back := make([]byte, n)
				rr, err := p.w.TagRecvNbx(back, tag|tagReply, ^uint64(0), &ucp.RequestParam{Peer: p.ep})
				require.NoError(t, err)
				require.NoError(t, send(ctx, p.ep, src, tag))
				require.NoError(t, rr.Wait(ctx))
				require.Equal(t, n, rr.Length(), "echo of %d bytes: length", n)
				require.Equal(t, crc32.ChecksumIEEE(src), crc32.ChecksumIEEE(back), "echo of %d bytes: checksum", n)
			}

			// Active messages, eager and rendezvous, echoed back by the peer's handler.
			replies := make(chan []byte, 1)
			require.NoError(t, p.w.SetAmHandler(amReply, func(m *ucp.AmMessage) {
				data := make([]byte, m.Length())
				r, err := m.RecvData(data, nil)
				if err != nil {
					replies <- []byte(err.Error())
					return
				}
				go func() {
					if err := r.Wait(ctx); err != nil {
						data = []byte(err.Error())
					}
					replies <- data
				}()
			}))
			for _, tc := range []struct {
				n     int
				flags ucp.AmSendFlags
			}{{64, ucp.AmEager}, {2 << 20, ucp.AmRendezvous}} {
				src := pattern(tc.n, 42)
				sr, err := p.ep.AmSendNbx(amEcho, []byte("hdr"), src, &ucp.RequestParam{AmFlags: tc.flags})
				require.NoError(t, err)
				var got []byte
				for got == nil {
					select {
					case got = <-replies:
					case <-ctx.Done():
						require.FailNowf(t, "no AM reply", "no AM reply for %d bytes; peer output:\n%s", tc.n, p.out)
					default:
						p.w.Progress()
					}
				}
				require.NoError(t, sr.Wait(ctx))
				require.Equal(t, crc32.ChecksumIEEE(src), crc32.ChecksumIEEE(got), "AM echo of %d bytes: checksum (%d bytes back)", tc.n, len(got))
			}

			// RMA: put into the peer's region, have the peer checksum it; get it back.
			src := pattern(peerRegion, 9)
			pr, err := p.ep.PutNbx(src, p.rkey.Base(), p.rkey, nil)
			require.NoError(t, err)
			require.NoError(t, pr.Wait(ctx))
			fr, err := p.ep.FlushNbx(nil)
			require.NoError(t, err)
			require.NoError(t, fr.Wait(ctx))
			var sizeMsg [8]byte
			binary.LittleEndian.PutUint64(sizeMsg[:], peerRegion)
			sumBuf := make([]byte, 4)
			sr, err := p.w.TagRecvNbx(sumBuf, tagChecksum|tagReply, ^uint64(0), nil)
			require.NoError(t, err)
			require.NoError(t, send(ctx, p.ep, sizeMsg[:], tagChecksum))
			require.NoError(t, sr.Wait(ctx))
			require.Equal(t, crc32.ChecksumIEEE(src), binary.LittleEndian.Uint32(sumBuf), "peer's region checksum differs from what was put")
			back := make([]byte, peerRegion)
			gr, err := p.ep.GetNbx(back, p.rkey.Base(), p.rkey, nil)
			require.NoError(t, err)
			require.NoError(t, gr.Wait(ctx))
			require.Equal(t, crc32.ChecksumIEEE(src), crc32.ChecksumIEEE(back), "get returned different data")

			// Atomics on the peer's region.
			binary.NativeEndian.PutUint64(src[:8], 0)
			ar, err := p.ep.AtomicNbx(ucp.AtomicParam{Op: ucp.AtomicSwap, Operand: 10}, p.rkey.Base(), p.rkey, nil)
			require.NoError(t, err)
			require.NoError(t, ar.Wait(ctx))
			require.Equal(t, binary.NativeEndian.Uint64(back[:8]), ar.Fetched(), "swap fetched")
			ar, err = p.ep.AtomicNbx(ucp.AtomicParam{Op: ucp.AtomicAdd, Operand: 5, Fetch: true}, p.rkey.Base(), p.rkey, nil)
			require.NoError(t, err)
			require.NoError(t, ar.Wait(ctx))
			require.Equal(t, uint64(10), ar.Fetched(), "add fetched")
		})
	}
}

// A peer that exits makes pending operations fail with a peer error instead of hanging.
func TestPeerExitFailsPendingOperations(t *testing.T) {
	p := spawnPeer(t, "tcp")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// A receive the peer will never answer, tied to the peer.
	pendingRecv, err := p.w.TagRecvNbx(make([]byte, 64), 0xdead, ^uint64(0), &ucp.RequestParam{Peer: p.ep})
	require.NoError(t, err)
	require.NoError(t, send(ctx, p.ep, nil, tagDie))
	// A rendezvous send the dead peer cannot complete.
	bigSend, err := p.ep.TagSendNbx(pattern(maxMsg, 1), 0xbeef, nil)
	start := time.Now()
	if err == nil {
		err = bigSend.Wait(ctx)
	}
	require.ErrorIs(t, err, ucp.ErrPeerFailed, "send to a dead peer")
	err = pendingRecv.Wait(ctx)
	require.ErrorIs(t, err, ucp.ErrPeerFailed, "receive from a dead peer")
	t.Logf("peer failure reported after %v: %v", time.Since(start), err)
	select {
	case err := <-p.epErr:
		require.ErrorIs(t, err, ucp.ErrPeerFailed, "error handler")
	case <-time.After(10 * time.Second):
		require.FailNow(t, "endpoint error handler never ran")
	}
	// Operations after the failure fail at once.
	_, err = p.ep.TagSendNbx([]byte("x"), 1, nil)
	require.ErrorIs(t, err, ucp.ErrPeerFailed, "send after failure")
	_, err = p.w.TagRecvNbx(make([]byte, 1), 1, ^uint64(0), &ucp.RequestParam{Peer: p.ep})
	require.ErrorIs(t, err, ucp.ErrPeerFailed, "receive naming a failed peer")
	var exitErr *exec.ExitError
	require.ErrorAs(t, p.exit(), &exitErr, "peer exit")
	require.Equal(t, 3, exitErr.ExitCode(), "peer exit code")
	require.NoError(t, p.ep.Close())
}

// Over shared memory UCX 1.13 has no peer failure detection; waits stay bounded by
// their context and the operation can be canceled.
func TestPeerExitOverSharedMemoryIsBounded(t *testing.T) {
	p := spawnPeer(t, "shm")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pendingRecv, err := p.w.TagRecvNbx(make([]byte, 64), 0xdead, ^uint64(0), nil)
	require.NoError(t, err)
	require.NoError(t, send(ctx, p.ep, nil, tagDie))
	_ = p.exit()
	short, cancelShort := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancelShort()
	require.ErrorIs(t, pendingRecv.Wait(short), context.DeadlineExceeded, "wait")
	pendingRecv.Cancel()
	require.ErrorIs(t, pendingRecv.Wait(ctx), ucp.ErrCanceled, "after cancel")
}

// spawnRole starts this test binary as a peer process in role (runPeer), told to
// connect to l, with env added; it accepts the child's endpoint with p and returns it
// with the child's output and a channel closed when the child exited. The child is
// killed when the test ends (cleanups registered before this call run after that).
func spawnRole(t testing.TB, l *ucp.Listener, role string, p *ucp.EndpointParams, env ...string) (ep *ucp.Endpoint, out *childOutput, done chan struct{}) {
	t.Helper()
	out, done = &childOutput{}, make(chan struct{})
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), envRole+"="+role, envListenAddr+"="+l.Addr()), env...)
	cmd.Stdout, cmd.Stderr = out, out
	require.NoError(t, cmd.Start())
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
	})
	dumpBeforeDeadline(t, role, cmd.Process, out, done)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ep, err := l.Accept(ctx, p)
	require.NoError(t, err, "%s output:\n%s", role, out)
	return ep, out, done
}

// dumpBeforeDeadline makes a child still running shortly before the test binary's
// deadline dump its goroutines (SIGQUIT) and prints what it wrote: the binary's own
// timeout panic shows only this process, and a hang often sits in the peer.
func dumpBeforeDeadline(t testing.TB, role string, child *os.Process, out *childOutput, done chan struct{}) {
	d, ok := t.(interface{ Deadline() (time.Time, bool) })
	if !ok {
		return
	}
	deadline, ok := d.Deadline()
	if !ok {
		return
	}
	wait := time.Until(deadline) - 15*time.Second
	if wait <= 0 {
		return
	}
	timer := time.AfterFunc(wait, func() {
		_ = child.Signal(syscall.SIGQUIT)
		select {
		case <-done: // the output is complete and no longer written
			fmt.Fprintf(os.Stderr, "%s child dumped 15 s before the test deadline; its output:\n%s\n", role, out)
		case <-time.After(5 * time.Second):
			fmt.Fprintf(os.Stderr, "%s child did not exit on SIGQUIT within 5 s\n", role)
		}
	})
	t.Cleanup(func() { timer.Stop() })
}

// childOutput collects a child's stdout and stderr: written by exec's copying
// goroutine while the test reads it (a failure message, a result line).
type childOutput struct {
	mu sync.Mutex
	b  strings.Builder
}

func (o *childOutput) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.Write(p)
}

func (o *childOutput) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.String()
}
