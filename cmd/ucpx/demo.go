package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math/rand"
	"os"
	"strconv"
	"time"

	"github.com/ucpx/ucpx/cgo/ucx"
	"github.com/ucpx/ucpx/trace"
	"github.com/ucpx/ucpx/ucp"
)

// Wire constants shared by `ucpx demo` and `ucpx demo-peer`.
const (
	demoTagToPeer   uint64 = 0x6d6f_0000_0001 // control messages parent -> peer
	demoTagToParent uint64 = 0x6d6f_0000_0002 // control messages peer -> parent
	demoTagData     uint64 = 0x6d6f_0001_0000 // + step number: tagged payloads

	demoAmData  uint = 7 // parent -> peer: header (seq, length, crc32c) + data
	demoAmReply uint = 8 // peer -> parent: header (seq, length, crc32c, ok)

	// demoPeerCrashEnv names a command on which demo-peer exits abruptly (tests).
	demoPeerCrashEnv = "UCPX_DEMO_PEER_CRASH_ON"

	demoRegion = 2 << 20 // the peer's registered memory for RMA and atomics
	demoCtlMax = 64 << 10
)

// demoCtl is a control message, JSON in a tagged message.
type demoCtl struct {
	Op    string `json:"op"` // hello, echo, verify, bye, result
	Tag   uint64 `json:"tag,omitempty"`
	Size  int    `json:"size,omitempty"`
	Off   int    `json:"off,omitempty"`
	CRC   uint32 `json:"crc,omitempty"`
	Value uint64 `json:"value,omitempty"`
	OK    bool   `json:"ok,omitempty"`
	Rkey  []byte `json:"rkey,omitempty"`
	Pid   int    `json:"pid,omitempty"`
	Err   string `json:"err,omitempty"`
}

// demoStep is one verified exchange. Later work adds condition-triggered steps here.
type demoStep struct {
	name string
	run  func(ctx context.Context, d *demoParent) (demoResult, error)
}

type demoResult struct {
	Step     string  `json:"step"`
	Bytes    int64   `json:"bytes"`
	CRC32C   string  `json:"crc32c,omitempty"`
	Verified bool    `json:"verified"`
	Ms       float64 `json:"ms"`
	Detail   string  `json:"detail,omitempty"`
	Err      string  `json:"error,omitempty"`
}

type demoReport struct {
	UCXVersion string       `json:"ucx_version"`
	TLS        string       `json:"tls"`
	Listener   string       `json:"listener"`
	PeerPid    int          `json:"peer_pid"`
	Steps      []demoResult `json:"steps"`
	OK         bool         `json:"ok"`
	Ms         float64      `json:"ms"`
}

// demoParent is the state of `ucpx demo` while its steps run.
type demoParent struct {
	w       *ucp.Worker
	ep      *ucp.Endpoint
	rkey    *ucp.Rkey
	local   *ucp.MemH // registered source/destination of RMA
	ctlBuf  []byte
	amAcks  map[uint64]demoAmAck
	nextSeq uint64
}

type demoAmAck struct {
	length int
	crc    uint32
	ok     bool
}

func demoSteps() []demoStep {
	steps := []demoStep{}
	for _, sz := range []int{8, 4 << 10, 64 << 10, 1 << 20} {
		sz, idx := sz, len(steps)
		name := "tag echo " + fmtBytes(sz)
		if sz >= 1<<20 {
			name += " (rendezvous)"
		}
		steps = append(steps, demoStep{name: name, run: func(ctx context.Context, d *demoParent) (demoResult, error) {
			return d.tagEcho(ctx, idx, sz)
		}})
	}
	steps = append(steps,
		demoStep{name: "active message 16 KiB (eager)", run: func(ctx context.Context, d *demoParent) (demoResult, error) {
			return d.activeMessage(ctx, 16<<10, ucp.AmEager)
		}},
		demoStep{name: "active message 1 MiB (rendezvous)", run: func(ctx context.Context, d *demoParent) (demoResult, error) {
			return d.activeMessage(ctx, 1<<20, ucp.AmRendezvous)
		}},
		demoStep{name: "RMA put 1 MiB + flush", run: func(ctx context.Context, d *demoParent) (demoResult, error) {
			return d.put(ctx, 4096, 1<<20)
		}},
		demoStep{name: "RMA get 1 MiB", run: func(ctx context.Context, d *demoParent) (demoResult, error) {
			return d.get(ctx, 4096, 1<<20)
		}},
		demoStep{name: "atomic fetch-add 64-bit", run: func(ctx context.Context, d *demoParent) (demoResult, error) {
			return d.atomicAdd(ctx, demoRegion-8, 42)
		}},
	)
	return append(steps, conditionSteps()...)
}

func fmtBytes(n int) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d B", n)
}

func crc(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }

func patternBytes(n int, seed int64) []byte {
	b := make([]byte, n)
	rand.New(rand.NewSource(seed)).Read(b)
	return b
}

func runDemo(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("demo", "[flags]", stderr)
	timeout := fs.Duration("timeout", 60*time.Second, "bound on the whole demo")
	stepTimeout := fs.Duration("step-timeout", 15*time.Second, "bound on each step")
	tls := fs.String("tls", "", "UCX_TLS for both processes (default: UCX's own choice)")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	tracePath := fs.String("trace", "", "write a trace of the conditioned operations to `file` (Chrome trace JSON; as UCPX_TRACE)")
	if st, ok := parseFlags(fs, args); !ok {
		return st
	}
	if *timeout <= 0 || *stepTimeout <= 0 {
		fmt.Fprintln(stderr, "ucpx demo: --timeout and --step-timeout must be positive")
		return 2
	}
	// The trace is written at the end: its file is checked before the demo runs.
	if err := checkTraceOutput(*tracePath); err != nil {
		fmt.Fprintf(stderr, "ucpx demo: %v\n", err)
		return 1
	}
	rec, stopTrace := startTrace(*tracePath)
	defer stopTrace()
	progress := stdout
	if *asJSON {
		progress = io.Discard
	}
	rep, err := demoMain(*timeout, *stepTimeout, *tls, progress, stderr)
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(rep)
	}
	status := 0
	if err != nil {
		fmt.Fprintf(stderr, "ucpx demo: FAILED: %v\n", err)
		status = 1
	}
	if rec != nil {
		if werr := rec.WriteFile(trace.ExpandPID(*tracePath)); werr != nil {
			fmt.Fprintf(stderr, "ucpx demo: --trace: %v\n", werr)
			status = 1
		}
	}
	return status
}

// newDemoContext is the UCX context of either side of the demo: UCX's default
// transports, or UCX_TLS=tls.
func newDemoContext(tls string) (*ucp.Context, error) {
	var cfg map[string]string
	if tls != "" {
		cfg = map[string]string{"TLS": tls}
	}
	c, err := ucp.NewContext(ucp.ContextParams{Config: cfg})
	if err != nil {
		return nil, fmt.Errorf("UCX context: %w", err)
	}
	return c, nil
}

func demoMain(timeout, stepTimeout time.Duration, tls string, out, logw io.Writer) (*demoReport, error) {
	start := time.Now()
	maj, mnr, rel := ucx.Version()
	rep := &demoReport{UCXVersion: fmt.Sprintf("%d.%d.%d", maj, mnr, rel), TLS: orMsg(tls, "(UCX default)"), Steps: []demoResult{}}
	ctx, cancel := context.WithTimeoutCause(context.Background(), timeout, fmt.Errorf("demo exceeded --timeout %v", timeout))
	defer cancel()
	ctx, fail := context.WithCancelCause(ctx)
	defer fail(nil)

	uctx, err := newDemoContext(tls)
	if err != nil {
		return rep, err
	}
	defer uctx.Close()
	w, err := uctx.NewWorker(ucp.WorkerParams{})
	if err != nil {
		return rep, fmt.Errorf("UCX worker: %w", err)
	}
	l, err := w.Listen("127.0.0.1:0", nil)
	if err != nil {
		return rep, fmt.Errorf("UCX listener: %w", err)
	}
	rep.Listener = l.Addr()
	fmt.Fprintf(out, "ucpx demo: UCX %s, UCX_TLS %s, listening on %s (UCX listener)\n", rep.UCXVersion, rep.TLS, rep.Listener)

	peerArgs := []string{"demo-peer", "--addr", l.Addr(), "--timeout", timeout.String()}
	if tls != "" {
		peerArgs = append(peerArgs, "--tls", tls)
	}
	peer, err := startPeer(peerArgs, logw, "[demo-peer] ")
	if err != nil {
		return rep, err
	}
	defer peer.kill() // no-op once reaped
	rep.PeerPid = peer.cmd.Process.Pid
	go func() {
		select {
		case <-peer.done:
			fail(fmt.Errorf("peer process exited unexpectedly (%v)", orErr(peer.err, "")))
		case <-ctx.Done():
		}
	}()

	d := &demoParent{w: w, ctlBuf: make([]byte, demoCtlMax), amAcks: map[uint64]demoAmAck{}}
	cctx, ccancel := context.WithTimeout(ctx, stepTimeout)
	d.ep, err = l.Accept(cctx, &ucp.EndpointParams{ErrorHandler: func(_ *ucp.Endpoint, err error) {
		fail(fmt.Errorf("peer endpoint failed: %w", err))
	}})
	if err != nil {
		ccancel()
		return rep, demoErr(ctx, fmt.Errorf("accept the peer's connection: %w", err))
	}
	_ = l.Close()
	// The peer's Connect completes while this side progresses: receiving its hello
	// (Wait drives progress) is what lets it finish.
	hello, err := d.recvCtl(cctx)
	ccancel()
	if err != nil {
		return rep, demoErr(ctx, fmt.Errorf("peer hello: %w", err))
	}
	if hello.Op != "hello" {
		return rep, fmt.Errorf("peer hello: got %q", hello.Op)
	}
	if d.rkey, err = d.ep.UnpackRkey(hello.Rkey); err != nil {
		return rep, fmt.Errorf("peer rkey: %w", err)
	}
	if d.local, err = uctx.MemAlloc(demoRegion); err != nil {
		return rep, fmt.Errorf("register local RMA buffer: %w", err)
	}
	if err := w.SetAmHandler(demoAmReply, d.onAmReply); err != nil {
		return rep, err
	}
	fmt.Fprintf(out, "connected to peer pid %d\n\n", hello.Pid)

	const rowFmt = "%-36s %9s  %-8s  %9s  %s\n"
	fmt.Fprintf(out, rowFmt, "step", "bytes", "crc32c", "time", "verified")
	var stepErr error
	for _, st := range demoSteps() {
		sctx, scancel := context.WithTimeoutCause(ctx, stepTimeout, fmt.Errorf("step exceeded --step-timeout %v", stepTimeout))
		t0 := time.Now()
		res, err := st.run(sctx, d)
		scancel()
		res.Step, res.Ms = st.name, float64(time.Since(t0).Microseconds())/1000
		if err != nil {
			err = demoErr(ctx, err)
			res.Verified, res.Err = false, err.Error()
			stepErr = peerFailure(peer, fmt.Errorf("step %q: %w", st.name, err))
		}
		rep.Steps = append(rep.Steps, res)
		verdict := "OK"
		if !res.Verified {
			verdict = "FAILED: " + res.Err
		}
		if res.Detail != "" {
			verdict += " (" + res.Detail + ")"
		}
		fmt.Fprintf(out, rowFmt, res.Step, strconv.FormatInt(res.Bytes, 10), res.CRC32C, fmt.Sprintf("%.2f ms", res.Ms), verdict)
		if stepErr != nil {
			break
		}
	}
	if stepErr != nil {
		return rep, stepErr
	}

	// Orderly shutdown: the peer confirms, closes its endpoint and exits with 0.
	sctx, scancel := context.WithTimeout(ctx, stepTimeout)
	defer scancel()
	if err := d.sendCtl(sctx, demoCtl{Op: "bye"}); err != nil {
		return rep, demoErr(ctx, fmt.Errorf("shutdown: %w", err))
	}
	if m, err := d.recvCtl(sctx); err != nil || m.Op != "bye" {
		return rep, demoErr(ctx, fmt.Errorf("shutdown: peer did not confirm: %v", orErr(err, m.Op)))
	}
	// Keep progressing while the peer flushes and closes its endpoint.
	closed := make(chan struct{})
	go func() { <-peer.done; close(closed) }()
	for done := false; !done; {
		select {
		case <-closed:
			done = true
		case <-sctx.Done():
			done = true
		default:
			w.Progress()
			_ = w.WaitForEvents(sctx, time.Millisecond)
		}
	}
	if err := peer.wait(5 * time.Second); err != nil {
		return rep, fmt.Errorf("peer exit: %w", err)
	}
	rep.OK = true
	rep.Ms = float64(time.Since(start).Microseconds()) / 1000
	fmt.Fprintf(out, "\nall %d steps verified; peer exited with status 0; %.1f ms in total\n", len(rep.Steps), rep.Ms)
	return rep, nil
}

// demoErr prefers the cause that cancelled ctx (peer died, endpoint failed, timeout)
// over the symptom (a wait returning context.Canceled).
func demoErr(ctx context.Context, err error) error {
	if cause := context.Cause(ctx); cause != nil && errors.Is(err, context.Canceled) {
		return fmt.Errorf("%w: %v", err, cause)
	}
	return err
}

func (d *demoParent) sendCtl(ctx context.Context, m demoCtl) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	r, err := d.ep.TagSendNbx(b, demoTagToPeer, nil)
	if err != nil {
		return err
	}
	return r.Wait(ctx)
}

func (d *demoParent) recvCtl(ctx context.Context) (demoCtl, error) {
	var m demoCtl
	r, err := d.w.TagRecvNbx(d.ctlBuf, demoTagToParent, fullMask, &ucp.RequestParam{Peer: d.ep})
	if err != nil {
		return m, err
	}
	if err := r.Wait(ctx); err != nil {
		r.Cancel()
		return m, err
	}
	if err := json.Unmarshal(d.ctlBuf[:r.Length()], &m); err != nil {
		return m, fmt.Errorf("bad control message from the peer: %w", err)
	}
	if m.Err != "" {
		return m, fmt.Errorf("peer reports: %s", m.Err)
	}
	return m, nil
}

// tagEcho sends size bytes with a tag; the peer checksums them and echoes them back.
func (d *demoParent) tagEcho(ctx context.Context, step, size int) (demoResult, error) {
	res := demoResult{}
	tag := demoTagData + uint64(step)
	data := patternBytes(size, int64(step)+1)
	want := crc(data)
	res.CRC32C = fmt.Sprintf("%08x", want)
	if err := d.sendCtl(ctx, demoCtl{Op: "echo", Tag: tag, Size: size}); err != nil {
		return res, err
	}
	echo := make([]byte, size)
	rr, err := d.w.TagRecvNbx(echo, tag, fullMask, &ucp.RequestParam{Peer: d.ep})
	if err != nil {
		return res, err
	}
	sr, err := d.ep.TagSendNbx(data, tag, nil)
	if err != nil {
		rr.Cancel()
		return res, err
	}
	if err := sr.Wait(ctx); err != nil {
		rr.Cancel()
		return res, fmt.Errorf("send: %w", err)
	}
	if err := rr.Wait(ctx); err != nil {
		rr.Cancel()
		return res, fmt.Errorf("receive echo: %w", err)
	}
	return res, d.echoVerified(ctx, &res, size, want, rr.Length(), crc(echo), "echo")
}

// echoVerified completes an echo step that sent size bytes with crc32c want and got
// echoLen bytes back whose crc32c was echoCRC where what says: it reads the peer's
// report on what it received and checks both ways.
func (d *demoParent) echoVerified(ctx context.Context, res *demoResult, size int, want uint32, echoLen int, echoCRC uint32, what string) error {
	m, err := d.recvCtl(ctx)
	if err != nil {
		return err
	}
	res.Bytes = int64(size) + int64(echoLen)
	switch {
	case m.CRC != want || m.Size != size:
		return fmt.Errorf("peer received %d bytes with crc32c %08x, sent %d with %08x", m.Size, m.CRC, size, want)
	case echoLen != size || echoCRC != want:
		return fmt.Errorf("%s: %d bytes with crc32c %08x, want %d with %08x", what, echoLen, echoCRC, size, want)
	}
	res.Verified = true
	return nil
}

// activeMessage sends an AM whose header carries (seq, length, crc32c); the peer's
// handler receives the data, checks it and replies with an AM of its own.
func (d *demoParent) activeMessage(ctx context.Context, size int, proto ucp.AmSendFlags) (demoResult, error) {
	res := demoResult{}
	d.nextSeq++
	seq := d.nextSeq
	data := patternBytes(size, int64(seq)+100)
	want := crc(data)
	res.CRC32C = fmt.Sprintf("%08x", want)
	hdr := make([]byte, 20)
	binary.LittleEndian.PutUint64(hdr, seq)
	binary.LittleEndian.PutUint64(hdr[8:], uint64(size))
	binary.LittleEndian.PutUint32(hdr[16:], want)
	r, err := d.ep.AmSendNbx(demoAmData, hdr, data, &ucp.RequestParam{AmFlags: ucp.AmReply | proto})
	if err != nil {
		return res, err
	}
	if err := r.Wait(ctx); err != nil {
		return res, fmt.Errorf("send: %w", err)
	}
	if err := pumpUntil(ctx, d.w, func() bool { _, ok := d.amAcks[seq]; return ok }); err != nil {
		return res, fmt.Errorf("waiting for the peer's reply: %w", err)
	}
	ack := d.amAcks[seq]
	delete(d.amAcks, seq)
	res.Bytes = int64(len(hdr) + size)
	if !ack.ok || ack.crc != want || ack.length != size {
		return res, fmt.Errorf("peer's handler got %d bytes with crc32c %08x (ok=%v), sent %d with %08x", ack.length, ack.crc, ack.ok, size, want)
	}
	res.Verified = true
	return res, nil
}

// onAmReply is the parent's AM handler: it runs on the goroutine driving progress.
func (d *demoParent) onAmReply(msg *ucp.AmMessage) {
	if len(msg.Header) < 21 {
		return
	}
	seq := binary.LittleEndian.Uint64(msg.Header)
	if seq != d.nextSeq {
		return // not the reply awaited: only the current one is kept
	}
	d.amAcks[seq] = demoAmAck{
		length: int(binary.LittleEndian.Uint64(msg.Header[8:])),
		crc:    binary.LittleEndian.Uint32(msg.Header[16:]),
		ok:     msg.Header[20] == 1,
	}
}

// put writes size bytes into the peer's registered memory at off, flushes, and has
// the peer verify the region.
func (d *demoParent) put(ctx context.Context, off, size int) (demoResult, error) {
	res := demoResult{}
	src := d.local.Bytes()[:size]
	copy(src, patternBytes(size, 777))
	want := crc(src)
	res.CRC32C = fmt.Sprintf("%08x", want)
	r, err := d.ep.PutNbx(src, d.rkey.Base()+uint64(off), d.rkey, &ucp.RequestParam{MemH: d.local})
	m, err := d.flushAndVerify(ctx, "put", r, err, off, size)
	if err != nil {
		return res, err
	}
	res.Bytes = int64(size)
	if m.CRC != want {
		return res, fmt.Errorf("peer's memory [%d, +%d) has crc32c %08x, put wrote %08x", off, size, m.CRC, want)
	}
	res.Verified = true
	return res, nil
}

// flushAndVerify completes an RMA step: it waits for r (the operation op posted, or
// the error posting it returned), flushes the endpoint so the data is in the peer's
// memory, and returns the peer's report on [off, +size).
func (d *demoParent) flushAndVerify(ctx context.Context, op string, r *ucp.Request, err error, off, size int) (demoCtl, error) {
	if err != nil {
		return demoCtl{}, err
	}
	if err := r.Wait(ctx); err != nil {
		return demoCtl{}, fmt.Errorf("%s: %w", op, err)
	}
	f, err := d.ep.FlushNbx(nil)
	if err != nil {
		return demoCtl{}, err
	}
	if err := f.Wait(ctx); err != nil {
		return demoCtl{}, fmt.Errorf("flush: %w", err)
	}
	if err := d.sendCtl(ctx, demoCtl{Op: "verify", Off: off, Size: size}); err != nil {
		return demoCtl{}, err
	}
	return d.recvCtl(ctx)
}

// get reads the region written by put back and compares it with what put wrote.
func (d *demoParent) get(ctx context.Context, off, size int) (demoResult, error) {
	res := demoResult{}
	want := crc(patternBytes(size, 777))
	dst := d.local.Bytes()[size : 2*size]
	clear(dst)
	r, err := d.ep.GetNbx(dst, d.rkey.Base()+uint64(off), d.rkey, &ucp.RequestParam{MemH: d.local})
	if err != nil {
		return res, err
	}
	if err := r.Wait(ctx); err != nil {
		return res, fmt.Errorf("get: %w", err)
	}
	res.Bytes = int64(size)
	got := crc(dst)
	res.CRC32C = fmt.Sprintf("%08x", got)
	if got != want {
		return res, fmt.Errorf("read back crc32c %08x, want %08x", got, want)
	}
	res.Verified = true
	return res, nil
}

// atomicAdd adds delta to the peer's 64-bit word at off with fetch, then has the
// peer confirm the new value.
func (d *demoParent) atomicAdd(ctx context.Context, off int, delta uint64) (demoResult, error) {
	res := demoResult{}
	r, err := d.ep.AtomicNbx(ucp.AtomicParam{Op: ucp.AtomicAdd, Operand: delta, Fetch: true}, d.rkey.Base()+uint64(off), d.rkey, nil)
	m, err := d.flushAndVerify(ctx, "atomic", r, err, off, 8)
	if err != nil {
		return res, err
	}
	res.Bytes = 8
	res.Detail = fmt.Sprintf("fetched %#x, now %#x", r.Fetched(), m.Value)
	if m.Value != r.Fetched()+delta {
		return res, fmt.Errorf("peer's word is %#x after adding %d to %#x", m.Value, delta, r.Fetched())
	}
	res.CRC32C = "-"
	res.Verified = true
	return res, nil
}

// pumpUntil drives w's progress until done() holds, parking on the worker's event fd
// when idle; ctx bounds it.
func pumpUntil(ctx context.Context, w *ucp.Worker, done func() bool) error {
	idle := 0
	for !done() {
		if w.Progress() > 0 {
			idle = 0
			continue
		}
		if idle++; idle < 64 {
			continue
		}
		if err := w.WaitForEvents(ctx, time.Millisecond); err != nil {
			if ctx.Err() != nil {
				return context.Cause(ctx)
			}
			return err
		}
	}
	return nil
}

// runDemoPeer is the hidden `ucpx demo-peer`: it connects to the demo's UCX listener
// and serves the steps until told to stop.
func runDemoPeer(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("demo-peer", "--addr host:port [flags]", stderr)
	addr := fs.String("addr", "", "the demo's UCX listener")
	tls := fs.String("tls", "", "UCX_TLS")
	timeout := fs.Duration("timeout", 60*time.Second, "bound on the whole run")
	if st, ok := parseFlags(fs, args); !ok {
		return st
	}
	if os.Getenv(reexecEnv) != "" {
		watchParent("ucpx demo-peer")
	}
	if err := demoPeerMain(*addr, *tls, *timeout); err != nil {
		fmt.Fprintf(stderr, "ucpx demo-peer: %v\n", err)
		return 1
	}
	return 0
}

func demoPeerMain(addr, tls string, timeout time.Duration) error {
	if addr == "" {
		return errors.New("--addr is required")
	}
	ctx, cancel := context.WithTimeoutCause(context.Background(), timeout, fmt.Errorf("demo-peer exceeded --timeout %v", timeout))
	defer cancel()
	ctx, fail := context.WithCancelCause(ctx)
	defer fail(nil)
	uctx, err := newDemoContext(tls)
	if err != nil {
		return err
	}
	defer uctx.Close()
	w, err := uctx.NewWorker(ucp.WorkerParams{})
	if err != nil {
		return err
	}
	region, err := uctx.MemAlloc(demoRegion)
	if err != nil {
		return fmt.Errorf("register %d bytes: %w", demoRegion, err)
	}
	clear(region.Bytes())
	rkey, err := region.PackRkey()
	if err != nil {
		return err
	}
	ep, err := w.Connect(ctx, addr, &ucp.EndpointParams{ErrorHandler: func(_ *ucp.Endpoint, err error) {
		fail(fmt.Errorf("endpoint to the demo failed: %w", err))
	}})
	if err != nil {
		return fmt.Errorf("connect to %s: %w", addr, err)
	}
	p := &demoPeer{w: w, ep: ep, region: region}
	if err := w.SetAmHandler(demoAmData, p.onAmData); err != nil {
		return err
	}
	if err := p.send(ctx, demoCtl{Op: "hello", Rkey: rkey, Pid: os.Getpid()}); err != nil {
		return fmt.Errorf("hello: %w", err)
	}
	buf := make([]byte, demoCtlMax)
	crashOn := os.Getenv(demoPeerCrashEnv)
	for {
		r, err := w.TagRecvNbx(buf, demoTagToPeer, fullMask, &ucp.RequestParam{Peer: ep})
		if err != nil {
			return err
		}
		// AM handlers and their replies run inside this wait's progress.
		if err := r.Wait(ctx); err != nil {
			r.Cancel()
			return fmt.Errorf("waiting for the next command: %w", orCause(ctx, err))
		}
		if p.amErr != nil {
			return p.amErr
		}
		var m demoCtl
		if err := json.Unmarshal(buf[:r.Length()], &m); err != nil {
			return fmt.Errorf("bad command: %w", err)
		}
		if crashOn != "" && crashOn == m.Op {
			// Fault injection for tests: die abruptly, as a crashed peer would.
			fmt.Fprintf(os.Stderr, "ucpx demo-peer: %s=%s: exiting abruptly\n", demoPeerCrashEnv, crashOn)
			os.Exit(7)
		}
		reply, err := p.handle(ctx, m)
		if err != nil {
			_ = p.send(ctx, demoCtl{Op: "result", Err: err.Error()})
			return fmt.Errorf("%s: %w", m.Op, err)
		}
		if err := p.send(ctx, reply); err != nil {
			return fmt.Errorf("reply to %s: %w", m.Op, err)
		}
		if m.Op == "bye" {
			if err := p.waitReplies(ctx); err != nil {
				return err
			}
			return ep.Close()
		}
	}
}

func orCause(ctx context.Context, err error) error {
	if c := context.Cause(ctx); c != nil && ctx.Err() != nil {
		return c
	}
	return err
}

type demoPeer struct {
	w       *ucp.Worker
	ep      *ucp.Endpoint
	region  *ucp.MemH
	replies []*ucp.Request // AM replies in flight (their headers stay referenced here)
	hdrs    [][]byte
	amErr   error
}

func (p *demoPeer) send(ctx context.Context, m demoCtl) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	r, err := p.ep.TagSendNbx(b, demoTagToParent, nil)
	if err != nil {
		return err
	}
	return orCause(ctx, r.Wait(ctx))
}

func (p *demoPeer) handle(ctx context.Context, m demoCtl) (demoCtl, error) {
	switch m.Op {
	case "echo":
		if m.Size < 0 || m.Size > 64<<20 {
			return demoCtl{}, fmt.Errorf("size %d out of range", m.Size)
		}
		buf := make([]byte, m.Size)
		r, err := p.w.TagRecvNbx(buf, m.Tag, fullMask, &ucp.RequestParam{Peer: p.ep})
		if err != nil {
			return demoCtl{}, err
		}
		if err := r.Wait(ctx); err != nil {
			r.Cancel()
			return demoCtl{}, orCause(ctx, err)
		}
		got := buf[:r.Length()]
		s, err := p.ep.TagSendNbx(got, m.Tag, nil)
		if err != nil {
			return demoCtl{}, err
		}
		if err := s.Wait(ctx); err != nil {
			return demoCtl{}, orCause(ctx, err)
		}
		return demoCtl{Op: "result", Size: len(got), CRC: crc(got)}, nil
	case "verify":
		if m.Off < 0 || m.Size <= 0 || m.Off+m.Size > p.region.Len() {
			return demoCtl{}, fmt.Errorf("range [%d, +%d) outside the %d-byte region", m.Off, m.Size, p.region.Len())
		}
		b := p.region.Bytes()[m.Off : m.Off+m.Size]
		reply := demoCtl{Op: "result", Size: m.Size, CRC: crc(b)}
		if m.Size == 8 {
			reply.Value = binary.NativeEndian.Uint64(b)
		}
		return reply, nil
	case "bye":
		return demoCtl{Op: "bye"}, nil
	}
	return demoCtl{}, fmt.Errorf("unknown command %q", m.Op)
}

// onAmData is the peer's AM handler: it receives the data (pulling it for rendezvous),
// checks it against the header and replies with an AM.
func (p *demoPeer) onAmData(msg *ucp.AmMessage) {
	if len(msg.Header) < 20 {
		p.amErr = fmt.Errorf("active message with a %d-byte header, want 20", len(msg.Header))
		return
	}
	seq := binary.LittleEndian.Uint64(msg.Header)
	wantLen := int(binary.LittleEndian.Uint64(msg.Header[8:]))
	wantCRC := binary.LittleEndian.Uint32(msg.Header[16:])
	reply := func(data []byte) {
		ok := len(data) == wantLen && crc(data) == wantCRC
		hdr := make([]byte, 21)
		binary.LittleEndian.PutUint64(hdr, seq)
		binary.LittleEndian.PutUint64(hdr[8:], uint64(len(data)))
		binary.LittleEndian.PutUint32(hdr[16:], crc(data))
		if ok {
			hdr[20] = 1
		}
		ep := msg.ReplyEndpoint()
		if ep == nil {
			ep = p.ep
		}
		r, err := ep.AmSendNbx(demoAmReply, hdr, nil, nil)
		if err != nil {
			p.amErr = fmt.Errorf("AM reply: %w", err)
			return
		}
		p.replies = append(p.replies, r)
		p.hdrs = append(p.hdrs, hdr)
	}
	if !msg.IsRendezvous() {
		reply(append([]byte(nil), msg.Data()...))
		return
	}
	buf := make([]byte, msg.Length())
	r, err := msg.RecvData(buf, &ucp.RequestParam{Callback: func(r *ucp.Request) {
		if err := r.Err(); err != nil {
			p.amErr = fmt.Errorf("AM rendezvous receive: %w", err)
			return
		}
		reply(buf)
	}})
	switch {
	case err != nil:
		p.amErr = fmt.Errorf("AM rendezvous receive: %w", err)
	case r.Done(): // completed in place: no callback
		reply(buf)
	}
}

// waitReplies completes the AM replies still in flight.
func (p *demoPeer) waitReplies(ctx context.Context) error {
	for _, r := range p.replies {
		if err := r.Wait(ctx); err != nil {
			return fmt.Errorf("AM reply: %w", orCause(ctx, err))
		}
	}
	p.replies, p.hdrs = nil, nil
	return nil
}
