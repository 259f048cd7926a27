package condition

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ucpx/ucpx/internal/errs"
)

// Chain is the completion condition: the trigger of an operation is the completion of
// other operations (receive completes -> send starts; the "triggered operations" of
// Portals and libfabric). Operations take it through ucp.RequestParam.Chain and form
// steps: every operation enqueued before Then is in the current step, Then opens the
// next. Start posts step 0; each later step is posted when every operation of the
// step before it completed, by the transport from its completion path (package ucp:
// from the UCX completion callback, in C, with no Go code on the way). After the last
// step an iteration ends and step 0 is posted again, Repeat iterations in all.
//
// A ping-pong is two chains: the initiator's steps [send] [receive], the responder's
// [receive] [send]; a ring's member forwards what it receives with [receive] [send].
// Unlike a Condition's operations, a chain's operations are described once and run
// every iteration with the same buffers, tags and peers; the chain has no per-operation
// Request. Errors stop the chain after the step's other operations completed (Err).
//
// A Chain is bound to the transport (the ucp.Worker) of its first operation; all its
// operations must be on it. Methods are safe for concurrent use.
//
// A run has not ended until every iteration ran or it stopped, also while it waits
// for the data of a received message that is pulled from the sender's memory (package
// ucp: a device buffer's tag message, which the goroutine in Wait or Test pulls): Start,
// Enqueue and Then give ErrBusy until then.
//
// A Chain dropped without Destroy is destroyed when the garbage collector finds it
// unreachable (package ucp: a cleanup; a run under way is stopped, as by Destroy); if
// the transport still holds its operations then, they are released when the worker
// closes. Call Destroy: until the collector runs, the chain keeps its buffers pinned
// and its operations posted.
type Chain struct {
	mu        sync.Mutex
	repeat    uint64
	step      int // the step the next operation joins
	stepOps   int // operations in that step
	owner     any
	runner    ChainRunner
	destroyed bool
	// keepGoing: a failed operation does not stop the run (a host graph's chain, whose
	// nodes after a failed one still run, as on the engine's path).
	keepGoing bool
}

// ChainParam configures NewChain.
type ChainParam struct {
	// Repeat is the number of iterations one Start runs (0: 1).
	Repeat uint64
}

// ChainRunner is a transport's side of a chain: it holds the chain's operations and
// posts each step from the completion of the one before. Package ucp implements it;
// users call Chain's methods. Chain calls it without holding its lock (a Wait must
// not block Destroy), so every method may race Destroy and must not touch a
// destroyed runner's state: after Destroy, Start, Wait and Test give ErrDestroyed.
type ChainRunner interface {
	// Start posts step 0 of the first of repeat iterations; keepGoing: a failed
	// operation does not stop the run (the later steps are posted all the same). A run
	// under way gives ErrBusy.
	Start(repeat uint64, keepGoing bool) error
	// Wait waits until the run ended (every iteration done, or an error), driving the
	// transport; ctx ending returns ctx's error and leaves the run going.
	Wait(ctx context.Context) error
	// Test drives the transport once and reports whether the run ended, with its error.
	Test() (bool, error)
	// Iterations is the number of iterations the current or last run completed.
	Iterations() uint64
	// Err is the first error of the last run, nil while it runs.
	Err() error
	// OpErr is the error of operation i (in the order they were enqueued) in the last
	// run: nil if it succeeded or did not complete in it.
	OpErr(i int) error
	// CancelOp cancels operation i if it is posted and pending: it completes with
	// ErrCanceled (a run that keeps going goes on).
	CancelOp(i int)
	// Running reports whether a run has not ended (it runs, or waits for the data of
	// messages it received).
	Running() bool
	// IterationTimes are the durations of the last iterations (up to 2048), oldest first.
	IterationTimes() []time.Duration
	// Destroy stops a run (its pending operations canceled) and releases the chain;
	// once it returned nil, nothing writes the operations' buffers. ErrBusy (errs.Busy
	// or ErrBusy): the transport still holds something of the chain, nothing was
	// released.
	Destroy() error
}

// NewChain makes an empty chain.
func NewChain(p ChainParam) (*Chain, error) {
	r := p.Repeat
	if r == 0 {
		r = 1
	}
	return &Chain{repeat: r}, nil
}

// Enqueue adds an operation of a transport to the chain's current step; transports
// call it (ucp's nbx calls with RequestParam.Chain). owner identifies the transport:
// the first operation binds the chain to it, with the runner newRunner makes; add
// appends the operation to the runner's step.
func (c *Chain) Enqueue(owner any, newRunner func() (ChainRunner, error), add func(r ChainRunner, step int) error) error {
	if c == nil {
		return fmt.Errorf("chain: nil chain: %w", ErrInvalidParam)
	}
	if owner == nil || newRunner == nil || add == nil {
		return fmt.Errorf("chain: enqueue needs an owner, a runner maker and an add: %w", ErrInvalidParam)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.destroyed:
		return fmt.Errorf("chain: %w", ErrDestroyed)
	case c.owner != nil && c.owner != owner:
		return fmt.Errorf("chain: its operations are on another worker: %w", ErrInvalidParam)
	case c.runner != nil && c.runner.Running():
		return fmt.Errorf("chain: running (wait for it before adding operations): %w", ErrBusy)
	}
	if c.runner == nil {
		r, err := newRunner()
		if err != nil {
			return err
		}
		if r == nil {
			return fmt.Errorf("chain: the transport made no runner: %w", ErrInvalidParam)
		}
		c.owner, c.runner = owner, r
	}
	if err := add(c.runner, c.step); err != nil {
		return err
	}
	c.stepOps++
	return nil
}

// Then ends the current step: operations enqueued from now on start when all of it
// completed. A step needs an operation.
func (c *Chain) Then() error {
	if c == nil {
		return fmt.Errorf("chain then: nil chain: %w", ErrInvalidParam)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.destroyed {
		return fmt.Errorf("chain then: %w", ErrDestroyed)
	}
	if c.stepOps == 0 {
		return fmt.Errorf("chain then: step %d has no operation: %w", c.step, ErrInvalidParam)
	}
	if c.runner != nil && c.runner.Running() {
		return fmt.Errorf("chain then: running (wait for it before adding steps): %w", ErrBusy)
	}
	c.step++
	c.stepOps = 0
	return nil
}

// Steps is the number of steps holding operations.
func (c *Chain) Steps() int {
	if c == nil {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stepOps == 0 {
		return c.step
	}
	return c.step + 1
}

// usable returns the runner, or why the chain cannot run.
func (c *Chain) usable(op string) (ChainRunner, error) {
	if c == nil {
		return nil, fmt.Errorf("chain %s: nil chain: %w", op, ErrInvalidParam)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.destroyed:
		return nil, fmt.Errorf("chain %s: %w", op, ErrDestroyed)
	case c.runner == nil:
		return nil, fmt.Errorf("chain %s: no operation enqueued: %w", op, ErrInvalidParam)
	}
	return c.runner, nil
}

// Start runs the chain: Repeat iterations of its steps. A chain whose run has not
// ended (running, or waiting for pulled data: see Chain) gives ErrBusy; one that
// ended may start again (the counters restart).
func (c *Chain) Start() error {
	r, err := c.usable("start")
	if err != nil {
		return err
	}
	return r.Start(c.repeat, c.keepGoing) // the runner gives ErrBusy (its check and start are one step)
}

// Wait waits until the run ended and returns its error: the first operation error, or
// ctx's error if ctx ended first (the run goes on; Destroy stops it).
func (c *Chain) Wait(ctx context.Context) error {
	if ctx == nil {
		return fmt.Errorf("chain wait: nil context: %w", ErrInvalidParam)
	}
	r, err := c.usable("wait")
	if err != nil {
		return err
	}
	return r.Wait(ctx)
}

// Test drives the transport once and reports whether the run ended, with its error.
func (c *Chain) Test() (bool, error) {
	r, err := c.usable("test")
	if err != nil {
		return false, err
	}
	return r.Test()
}

// Iterations is the number of iterations the current or last run completed.
func (c *Chain) Iterations() uint64 {
	r, err := c.usable("iterations")
	if err != nil {
		return 0
	}
	return r.Iterations()
}

// Err is the first error of the last run (nil while running or after success).
func (c *Chain) Err() error {
	r, err := c.usable("err")
	if err != nil {
		return nil
	}
	return r.Err()
}

// OpErr is the error of operation i (in the order they were enqueued, from 0) in the
// last run: nil if it succeeded or did not complete in it (the run stopped before it).
func (c *Chain) OpErr(i int) error {
	r, err := c.usable("op err")
	if err != nil {
		return nil
	}
	return r.OpErr(i)
}

// cancelOp cancels operation i if it is posted and pending.
func (c *Chain) cancelOp(i int) {
	if r, err := c.usable("cancel"); err == nil {
		r.CancelOp(i)
	}
}

// IterationTimes are the durations of the last iterations of the run (up to 2048),
// oldest first: the transport stamps each iteration's end in its completion path.
func (c *Chain) IterationTimes() []time.Duration {
	r, err := c.usable("iteration times")
	if err != nil {
		return nil
	}
	return r.IterationTimes()
}

// Destroy stops a run (its pending operations are canceled) and releases the chain.
// A second Destroy returns ErrDestroyed. Messages the run received whose data was still
// to be pulled are answered without it (package ucp: their sends complete, as for a
// receive too short for them), and pulls under way are waited for (bounded): once
// Destroy returned nil, nothing writes the chain's buffers. If the transport still
// holds operations after canceling them, or a pull still copies (ErrBusy), nothing is
// released: Destroy again later.
func (c *Chain) Destroy() error {
	if c == nil {
		return fmt.Errorf("chain destroy: nil chain: %w", ErrInvalidParam)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.destroyed {
		return fmt.Errorf("chain destroy: %w", ErrDestroyed)
	}
	c.destroyed = true
	if c.runner != nil {
		if err := c.runner.Destroy(); err != nil {
			if errors.Is(err, errs.Busy) { // ErrBusy, or the transport's own
				c.destroyed = false // operations UCX still holds: Destroy again later
			}
			return err
		}
	}
	return nil
}
