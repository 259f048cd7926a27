package bootstrap

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/ucpx/ucpx/ucp"
)

// The environment of a rank, with the meaning of torchrun's RANK, WORLD_SIZE and
// MASTER_ADDR:MASTER_PORT.
const (
	EnvRank       = "UCPX_RANK"
	EnvSize       = "UCPX_SIZE"
	EnvRendezvous = "UCPX_RENDEZVOUS"
	// EnvInsecure=1 lets rank 0 serve the rendezvous on a non-loopback address
	// without a key (Options.Insecure).
	EnvInsecure = "UCPX_RENDEZVOUS_INSECURE"
)

// DefaultTimeout bounds New when its context has no deadline, and each lazy Endpoint.
const DefaultTimeout = 2 * time.Minute

// Options configures a job; the zero value is usable.
type Options struct {
	// Worker communicates for the job; nil makes a Context (ContextParams) and a
	// Worker (WorkerParams) that Close closes.
	Worker        *ucp.Worker
	ContextParams ucp.ContextParams
	WorkerParams  ucp.WorkerParams
	// EndpointParams are used for every Endpoint; the job chains its own
	// ErrorHandler after the given one. NoPeerErrorHandling lets UCX 1.13 use shared
	// memory between ranks of one host, at the cost of failure detection; such
	// endpoints cannot be force-closed, so Close flushes those it made on a caller's
	// Worker (see Close).
	EndpointParams ucp.EndpointParams
	// Key authenticates the rendezvous (mutual HMAC-SHA256 challenge-response) and,
	// as ContextParams.AuthKey of the job's own context, ucp's wire-up: worker
	// addresses are sealed under it. Nil reads UCPX_AUTH_KEY_FILE, as ucp.NewContext
	// does. A caller's Worker keeps its context's key.
	Key []byte
	// Insecure lets rank 0 serve a non-loopback rendezvous without a key.
	Insecure bool
	// Listen is where rank 0 serves (default: the rendezvous address).
	Listen string
	// OnFailure runs once per failed rank, whether UCX reported its endpoint failed
	// or the rendezvous saw it go without leaving: one call at a time, in the order
	// the failures were recorded, on a goroutine of the job's (never the store's
	// reader nor UCX's progress), so it may use the Store, Barrier and Endpoint; while
	// it blocks, later failures wait for their call (Job.Failed lists them at once).
	// No call starts once Close began (one under way may still be running).
	OnFailure func(rank int, err error)
	// Timeout bounds a lazy Endpoint's wait for the peer's address (DefaultTimeout).
	Timeout time.Duration
}

// Config is what FromEnv reads from the environment.
type Config struct {
	Rank, Size int
	Rendezvous string // host:port (port 1..65535) of rank 0's rendezvous
}

// ConfigFromEnv reads UCPX_RANK, UCPX_SIZE and UCPX_RENDEZVOUS.
func ConfigFromEnv() (Config, error) {
	var c Config
	var err error
	for _, v := range []struct {
		name string
		dst  *int
	}{{EnvRank, &c.Rank}, {EnvSize, &c.Size}} {
		s := os.Getenv(v.name)
		if *v.dst, err = strconv.Atoi(s); err != nil {
			return c, fmt.Errorf("bootstrap: %s=%q is not a number (ucpx launch sets it): %w", v.name, s, ErrInvalidParam)
		}
	}
	c.Rendezvous = os.Getenv(EnvRendezvous)
	return c, c.check()
}

func (c Config) check() error {
	if c.Size < 1 || c.Size > MaxRanks || c.Rank < 0 || c.Rank >= c.Size {
		return fmt.Errorf("bootstrap: rank %d of %d (want 0 <= rank < size <= %d): %w", c.Rank, c.Size, MaxRanks, ErrInvalidParam)
	}
	if err := checkHostPort(c.Rendezvous, false); err != nil {
		return fmt.Errorf("bootstrap: rendezvous: %w", err)
	}
	return nil
}

// Job is this process's place in a job of Size ranks: the worker, the store, the
// barrier and endpoints to the other ranks, created on first use.
type Job struct {
	Rank, Size int

	opts   Options
	ctx    *ucp.Context // owned, nil when Options.Worker was given
	worker *ucp.Worker
	store  *Store
	server *Server // rank 0 only

	mu      sync.Mutex
	eps     map[int]*ucp.Endpoint
	dialing map[int]chan struct{}
	byEP    map[*ucp.Endpoint]int
	failed  map[int]error
	barrier uint64
	// abandoned: barriers whose callers gave up (ctx ended), by generation; the next
	// Barrier calls resume them.
	abandoned []*barrierCall
	// events: failures waiting for OnFailure; delivering while a goroutine calls it.
	events     []failure
	delivering bool
	closed     bool
}

type barrierCall struct {
	gen uint64
	ch  chan frame
}

type failure struct {
	rank int
	err  error
}

// FromEnv joins the job that UCPX_RANK, UCPX_SIZE and UCPX_RENDEZVOUS describe (as
// `ucpx launch` or a scheduler sets them); see New.
func FromEnv(ctx context.Context, opts *Options) (*Job, error) {
	c, err := ConfigFromEnv()
	if err != nil {
		return nil, err
	}
	return New(ctx, c, opts)
}

// New joins a job: rank 0 serves the rendezvous, every rank authenticates, publishes
// its worker address and waits until all Size ranks have joined (ctx bounds the wait;
// DefaultTimeout without a deadline). If the job does not form in time, New returns
// as ctx ends (ErrTimedOut), rank 0 having stopped serving. No endpoint is created
// here: Endpoint(r) makes the one to rank r when first asked.
func New(ctx context.Context, c Config, opts *Options) (*Job, error) {
	if ctx == nil {
		return nil, fmt.Errorf("bootstrap: new: nil context: %w", ErrInvalidParam)
	}
	if err := c.check(); err != nil {
		return nil, err
	}
	j := &Job{Rank: c.Rank, Size: c.Size, eps: map[int]*ucp.Endpoint{}, dialing: map[int]chan struct{}{},
		byEP: map[*ucp.Endpoint]int{}, failed: map[int]error{}}
	if opts != nil {
		j.opts = *opts
	}
	if j.opts.Timeout <= 0 {
		j.opts.Timeout = DefaultTimeout
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultTimeout)
		defer cancel()
	}
	key := j.opts.Key
	if key == nil {
		var err error
		if key, err = LoadKey(); err != nil {
			return nil, err
		}
	}
	insecure := j.opts.Insecure || os.Getenv(EnvInsecure) == "1"
	ok := false
	defer func() {
		if !ok {
			// Nobody used a job that never formed: rank 0 stops serving at once.
			_ = j.close(false)
		}
	}()
	if j.Rank == 0 {
		listen := j.opts.Listen
		if listen == "" {
			listen = c.Rendezvous
		}
		var err error
		if j.server, err = Serve(listen, c.Size, key, insecure); err != nil {
			return nil, err
		}
	}
	var err error
	if j.store, err = dial(ctx, c.Rendezvous, key, c.Rank, c.Size, func(r int) {
		j.markFailed(r, &RankError{Rank: r, Err: fmt.Errorf("bootstrap: the rendezvous lost rank %d: %w", r, ErrRankFailed)})
	}); err != nil {
		return nil, err
	}
	// The worker is made once the rendezvous answered: a host whose network is not
	// up yet (a link coming back) would otherwise get a worker without its interfaces.
	if j.worker = j.opts.Worker; j.worker == nil {
		cp := withFailureDetection(j.opts.ContextParams)
		if cp.AuthKey == nil {
			cp.AuthKey = key // the addresses in the store are sealed under the job's key
		}
		if j.ctx, err = ucp.NewContext(cp); err != nil {
			return nil, err
		}
		if j.worker, err = j.ctx.NewWorker(j.opts.WorkerParams); err != nil {
			return nil, err
		}
	}
	addr, err := j.worker.Address()
	if err != nil {
		return nil, err
	}
	if err := j.store.Set(ctx, addrKey(c.Rank), addr); err != nil {
		return nil, err
	}
	if err := j.Barrier(ctx); err != nil {
		return nil, fmt.Errorf("bootstrap: waiting for %d ranks to join: %w", c.Size, err)
	}
	ok = true
	return j, nil
}

// FailureDetection is the UCX configuration a job's own context gets unless the
// UCX_* environment or ContextParams.Config sets the same names: UCP's keepalive
// probes every endpoint each second (UCX's default: 20 s), so a peer that went silent
// (a host whose link is down) leaves unacknowledged data on every connection to it
// and the kernel fails them after net.ipv4.tcp_retries2 retransmissions: about 6 s at
// 4, about 15 minutes at Linux's default 15 (docs/scaling.md). A peer whose process
// died is noticed at once (the kernel resets its connections).
var FailureDetection = map[string]string{
	"KEEPALIVE_INTERVAL": "1s",
}

func withFailureDetection(p ucp.ContextParams) ucp.ContextParams {
	cfg := make(map[string]string, len(p.Config)+len(FailureDetection))
	for k, v := range p.Config {
		cfg[k] = v
	}
	for k, v := range FailureDetection {
		_, set := cfg[k]
		_, setUCX := cfg["UCX_"+k]
		if _, env := os.LookupEnv("UCX_" + k); !set && !setUCX && !env {
			cfg[k] = v
		}
	}
	p.Config = cfg
	return p
}

func addrKey(rank int) string { return "ucpx/addr/" + strconv.Itoa(rank) }

// Worker is the job's worker.
func (j *Job) Worker() *ucp.Worker {
	if j == nil {
		return nil
	}
	return j.worker
}

// Store is the job's key-value store.
func (j *Job) Store() *Store {
	if j == nil {
		return nil
	}
	return j.store
}

// Barrier returns once every rank has called it as often as this one; it fails with
// a RankError (ErrRankFailed) naming a rank that failed before all arrived, or at
// once naming a rank that has left the job (Job.Close: the error matches ErrClosed
// too), since the barrier can no longer complete.
//
// A call that ctx ends (ErrTimedOut or ErrCanceled) has still arrived: the job's next
// Barrier call resumes that same barrier instead of arriving at a new one, so a rank
// may retry with short deadlines until the others arrive.
func (j *Job) Barrier(ctx context.Context) error {
	if j == nil {
		return errNilJob("barrier")
	}
	if ctx == nil {
		return fmt.Errorf("bootstrap: barrier: nil context: %w", ErrInvalidParam)
	}
	j.mu.Lock()
	if j.closed {
		j.mu.Unlock()
		return fmt.Errorf("bootstrap: barrier: %w", ErrClosed)
	}
	if j.store == nil {
		j.mu.Unlock()
		return errNotMade("barrier")
	}
	var b *barrierCall
	if len(j.abandoned) > 0 {
		b = j.abandoned[0]
		j.abandoned = j.abandoned[1:]
		j.mu.Unlock()
	} else {
		j.barrier++
		b = &barrierCall{gen: j.barrier}
		j.mu.Unlock()
		var err error
		if b.ch, err = j.store.start(&frame{op: opBarrier, gen: b.gen}); err != nil {
			return err
		}
	}
	r, err := j.store.await(ctx, b.ch)
	if r == nil && ctx.Err() != nil {
		// Still arrived: the next call waits for this barrier's answer.
		j.mu.Lock()
		i := sort.Search(len(j.abandoned), func(i int) bool { return j.abandoned[i].gen > b.gen })
		j.abandoned = slices.Insert(j.abandoned, i, b)
		j.mu.Unlock()
	}
	_, err = answer(r, err)
	return err
}

// Endpoint returns the endpoint to rank, creating it on first use from the address
// the rank published (waiting up to Options.Timeout for it). A rank's failure fails
// its endpoint's operations with errors matching ucp.ErrPeerFailed; RankOf names it.
func (j *Job) Endpoint(rank int) (*ucp.Endpoint, error) {
	if j == nil {
		return nil, errNilJob("endpoint")
	}
	if rank < 0 || rank >= j.Size {
		return nil, fmt.Errorf("bootstrap: rank %d of a job of %d: %w", rank, j.Size, ErrInvalidParam)
	}
	if j.store == nil || j.worker == nil || j.eps == nil || j.dialing == nil {
		return nil, errNotMade("endpoint")
	}
	for {
		j.mu.Lock()
		if j.closed {
			j.mu.Unlock()
			return nil, fmt.Errorf("bootstrap: endpoint: %w", ErrClosed)
		}
		if ep := j.eps[rank]; ep != nil {
			j.mu.Unlock()
			return ep, nil
		}
		wait, busy := j.dialing[rank]
		if !busy {
			wait = make(chan struct{})
			j.dialing[rank] = wait
			j.mu.Unlock()
			ep, err := j.connect(rank)
			afterConnect()
			j.mu.Lock()
			delete(j.dialing, rank)
			close(wait)
			closed := j.closed
			if err == nil && !closed {
				j.eps[rank], j.byEP[ep] = ep, rank
			}
			j.mu.Unlock()
			if err == nil && closed {
				// Close ran while this dialed: it closed the endpoints it saw, not
				// this one.
				return nil, errors.Join(fmt.Errorf("bootstrap: endpoint: %w", ErrClosed),
					j.closeEndpoints(map[int]*ucp.Endpoint{rank: ep}))
			}
			return ep, err
		}
		j.mu.Unlock()
		<-wait
	}
}

// afterConnect runs between a dial and its endpoint's registration (tests widen the
// window Close may come in).
var afterConnect = func() {}

// closeFlushTimeout bounds the wait of closeEndpoints, for all its endpoints together.
const closeFlushTimeout = 5 * time.Second

// closeEndpoints closes endpoints the job made on the caller's worker, by rank. Those
// with peer error handling are force-closed, as closing a worker does. Force mode is
// undefined in UCX on an endpoint without it (NoPeerErrorHandling), and ucp refuses
// it (ErrInvalidParam, the endpoint left open), so those are flushed: a flush never
// finishes while sends are queued for a peer that stopped progressing, or died where
// nothing tells this process (another host). Every endpoint is closed for ucp at once
// (ucp.Live counts it no more); the flushes share one closeFlushTimeout, and the ranks
// of those unfinished then are named in an error matching ErrTimedOut: UCX releases
// their endpoints, with the operations still pending on them, when the worker closes.
func (j *Job) closeEndpoints(eps map[int]*ucp.Endpoint) error {
	force := !j.opts.EndpointParams.NoPeerErrorHandling
	ranks := make([]int, 0, len(eps))
	for r := range eps {
		ranks = append(ranks, r)
	}
	sort.Ints(ranks)
	ctx, cancel := context.WithTimeout(context.Background(), closeFlushTimeout)
	defer cancel()
	var errs []error
	reqs := make(map[int]*ucp.Request, len(ranks))
	for _, r := range ranks {
		req, err := eps[r].CloseNbx(force)
		switch {
		case err == nil:
			reqs[r] = req
		case errors.Is(err, ucp.ErrClosed):
			// The caller closed the endpoint, or its worker, first: nothing is left.
		default:
			errs = append(errs, fmt.Errorf("bootstrap: close: endpoint to rank %d: %w", r, err))
		}
	}
	var unflushed []int
	for _, r := range ranks {
		req := reqs[r]
		if req == nil {
			continue
		}
		err := req.Wait(ctx)
		switch {
		case !req.Done():
			unflushed = append(unflushed, r)
		case err == nil, errors.Is(err, ucp.ErrPeerFailed):
			// Closed; a peer already gone had nothing more to hear.
		default:
			errs = append(errs, fmt.Errorf("bootstrap: close: endpoint to rank %d: %w", r, err))
		}
	}
	if len(unflushed) > 0 {
		errs = append(errs, ctxErr(ctx, fmt.Sprintf("close: the endpoints to ranks %v did not flush in %v "+
			"(ranks that stopped progressing or died unseen; closed without it, and the worker's Close "+
			"releases what is still pending on them)", unflushed, closeFlushTimeout)))
	}
	return errors.Join(errs...)
}

func (j *Job) connect(rank int) (*ucp.Endpoint, error) {
	ctx, cancel := context.WithTimeout(context.Background(), j.opts.Timeout)
	defer cancel()
	addr, err := j.store.Wait(ctx, addrKey(rank))
	if err != nil {
		return nil, fmt.Errorf("bootstrap: address of rank %d: %w", rank, err)
	}
	p := j.opts.EndpointParams
	user := p.ErrorHandler
	p.ErrorHandler = func(ep *ucp.Endpoint, err error) {
		if user != nil {
			user(ep, err)
		}
		j.markFailed(rank, &RankError{Rank: rank, Err: err})
	}
	ep, err := j.worker.ConnectAddress(addr, &p)
	if err != nil {
		return nil, fmt.Errorf("bootstrap: endpoint to rank %d: %w", rank, err)
	}
	return ep, nil
}

// RankOf names the rank an endpoint of Endpoint leads to.
func (j *Job) RankOf(ep *ucp.Endpoint) (int, bool) {
	if j == nil {
		return 0, false
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	r, ok := j.byEP[ep]
	return r, ok
}

// Failed lists the ranks known to have failed, in order, as the endpoints and the
// rendezvous reported them.
func (j *Job) Failed() []int {
	if j == nil {
		return nil
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	out := make([]int, 0, len(j.failed))
	for r := range j.failed {
		out = append(out, r)
	}
	sort.Ints(out)
	return out
}

// FailedErr returns the error a failed rank was reported with, nil if it has not failed.
// An operation on the rank's endpoint that failed with the peer's failure has it
// reported here too, even before the endpoint's error handler ran (the handler runs on
// the goroutine that progressed, once that let go of the worker).
func (j *Job) FailedErr(rank int) error {
	if j == nil {
		return errNilJob("failed rank")
	}
	j.mu.Lock()
	err, ep := j.failed[rank], j.eps[rank]
	j.mu.Unlock()
	if err != nil || ep == nil {
		return err
	}
	epErr := ep.Err()
	if epErr == nil {
		return nil
	}
	j.markFailed(rank, &RankError{Rank: rank, Err: epErr})
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.failed[rank]
}

// markFailed records a rank's failure and queues its OnFailure call; it never blocks
// (it runs on the store's reader and on UCX's progress).
func (j *Job) markFailed(rank int, err error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if _, had := j.failed[rank]; had || j.failed == nil {
		return
	}
	j.failed[rank] = err
	fn := j.opts.OnFailure
	if fn == nil || j.closed {
		return
	}
	j.events = append(j.events, failure{rank, err})
	if !j.delivering {
		j.delivering = true
		go j.deliver(fn)
	}
}

// deliver calls OnFailure for the queued failures, in order, until none is left.
func (j *Job) deliver(fn func(int, error)) {
	for {
		j.mu.Lock()
		if len(j.events) == 0 {
			j.delivering = false
			j.mu.Unlock()
			return
		}
		ev := j.events[0]
		j.events = j.events[1:]
		j.mu.Unlock()
		fn(ev.rank, ev.err)
	}
}

// Close leaves the job: it tells the rendezvous it leaves on purpose, closes the
// endpoints and, if it made them, the worker and context. Rank 0 keeps serving the
// rendezvous until every rank has left or failed (at most DefaultTimeout). Call
// Barrier first when others may still use this rank's endpoints.
//
// Endpoints with peer error handling are force-closed (ranks still using them see
// them fail). On a caller's Worker, endpoints without it
// (EndpointParams.NoPeerErrorHandling), which UCX cannot force-close, are flushed
// instead, all within one 5 s bound. A flush cannot finish while sends are queued for
// a rank that stopped progressing, or died where nothing tells this process (another
// host); Close then returns an error matching ErrTimedOut that names those ranks. The
// endpoints are closed all the same (ucp.Live no longer counts them), and the
// caller's Worker.Close releases the UCX endpoints and the operations still pending
// on them. A worker the job made closes every endpoint with itself.
func (j *Job) Close() error {
	if j == nil {
		return errNilJob("close")
	}
	return j.close(true)
}

// close is Close; rank 0 waits for the others to leave only if wait.
func (j *Job) close(wait bool) error {
	j.mu.Lock()
	if j.closed {
		j.mu.Unlock()
		return fmt.Errorf("bootstrap: job: %w", ErrClosed)
	}
	j.closed = true
	j.events = nil // failures not delivered yet are not: no call starts after Close
	eps := j.eps
	j.eps = map[int]*ucp.Endpoint{}
	j.mu.Unlock()
	var errs []error
	keep := func(err error) { errs = append(errs, err) } // nil ones are dropped by Join
	if j.store != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = j.store.bye(ctx)
		cancel()
		keep(j.store.close())
	}
	if j.ctx == nil {
		// The caller's worker: close what the job opened on it, force-closing as
		// closing a worker does where UCX allows it (a flush needs the peer's worker
		// progressed, which a peer that has closed its job no longer does), and
		// flushing, bounded, where it does not.
		keep(j.closeEndpoints(eps))
	}
	if j.ctx != nil { // closing the worker closes its endpoints
		keep(j.ctx.Close())
	}
	if j.server != nil {
		if wait {
			t := time.NewTimer(DefaultTimeout)
			select {
			case <-j.server.Done():
			case <-t.C:
			}
			t.Stop()
		}
		_ = j.server.Close()
	}
	return errors.Join(errs...)
}

// errNilJob is what a nil Job's methods return (the handle of a failed Join).
func errNilJob(op string) error {
	return fmt.Errorf("bootstrap: %s: nil job: %w", op, ErrInvalidParam)
}

// errNotMade is what a Job that New did not make (a zero value) returns.
func errNotMade(op string) error {
	return fmt.Errorf("bootstrap: %s: a Job not made by New: %w", op, ErrInvalidParam)
}
