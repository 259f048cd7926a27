package condition

import (
	"context"
	"fmt"

	"github.com/ucpx/ucpx/internal/errs"
	"github.com/ucpx/ucpx/protocol"
	"github.com/ucpx/ucpx/stream/streamcore"
)

// ChainOperation is an Operation a completion chain can run (package ucp: tag sends
// and receives of host memory moved as is). EnqueueChain adds it to c's current step,
// with the buffer, tag and peer Issue would use for part p.
type ChainOperation interface {
	Operation
	EnqueueChain(c *Chain, p *protocol.Part) error
}

// errNotChainable: a host graph's operations cannot run as one chain; the graph
// launches node by node.
var errNotChainable = errs.New("condition: the graph's operations cannot run as a chain", errs.Unsupported)

// graphChain is a host graph launched as one completion chain (streamcore.ChainedLaunch):
// the operations of every layer's Graph conditions are one step, and each step is posted
// by the transport from the completion of the step before. The engine's own state of
// those conditions is untouched: their triggers stay 0, so it issues nothing for them.
type graphChain struct {
	e     *Engine
	chain *Chain
	conds []*Condition // every condition of the chain
	// armed: each condition's last sequence number when the chain was made; one armed
	// since (an operation added) means the chain no longer describes the node.
	armed  []uint64
	opPart []*part // each chained operation's part, in enqueue order
}

// ChainLaunch implements streamcore.Chainer for the engine's Graph conditions: layers
// name them by trigger word. Every operation must be a ChainOperation moved in one part
// as is, and the engine must not trace (a chain records no timeline).
func (e *Engine) ChainLaunch(layers [][]*streamcore.Word) (streamcore.ChainedLaunch, error) {
	switch {
	case e == nil:
		return nil, fmt.Errorf("chain launch: nil engine: %w", ErrInvalidParam)
	case len(layers) == 0:
		return nil, fmt.Errorf("%w: no layers", errNotChainable)
	case e.trace.Load() != nil:
		return nil, fmt.Errorf("%w: the engine traces", errNotChainable)
	}
	g := &graphChain{e: e, chain: &Chain{repeat: 1, keepGoing: true}}
	// A round takes what was enqueued (only rounds may: a full round follows what they
	// took into the channels), waiting for one another goroutine runs; parts enqueued
	// since make the chain wait. The operations join the chain under mu, which rounds
	// hold while they issue (mu before the worker's lock, as there).
	e.drive.Lock()
	e.roundLocked(false) // unlocks drive
	e.mu.Lock()
	err := g.enqueueLocked(layers)
	e.mu.Unlock()
	if err != nil {
		_ = g.chain.Destroy()
		return nil, err
	}
	return g, nil
}

// enqueueLocked adds the operations of the layers' conditions to the chain, a step
// per layer. Caller holds e.mu.
func (g *graphChain) enqueueLocked(layers [][]*streamcore.Word) error {
	e := g.e
	if e.added() {
		return fmt.Errorf("%w: operations being enqueued", errNotChainable)
	}
	for li, layer := range layers {
		if len(layer) == 0 {
			return fmt.Errorf("%w: an empty layer", errNotChainable)
		}
		if li > 0 {
			if err := g.chain.Then(); err != nil {
				return err
			}
		}
		for _, t := range layer {
			ch := e.byTrigger[t]
			if ch == nil || len(ch.ops) == 0 || ch.running > 0 || ch.cond.destroyed.Load() {
				return fmt.Errorf("%w: a node without operations, or running", errNotChainable)
			}
			for _, p := range ch.ops {
				co, ok := p.op.operation.(ChainOperation)
				if !ok || len(p.op.plan.Parts) != 1 || p.op.plan.Staged() || p.canceled {
					return fmt.Errorf("%w: %s", errNotChainable, p.op.what)
				}
				if err := co.EnqueueChain(g.chain, p.plan); err != nil {
					return fmt.Errorf("%w: %w", errNotChainable, err)
				}
				g.opPart = append(g.opPart, p)
			}
			g.conds = append(g.conds, ch.cond)
			g.armed = append(g.armed, ch.ops[len(ch.ops)-1].seq)
		}
	}
	return nil
}

// Run implements streamcore.ChainedLaunch.
func (g *graphChain) Run(ctx context.Context) (bool, error) {
	e := g.e
	if e.trace.Load() != nil || e.closed() {
		return false, nil
	}
	for i, c := range g.conds {
		// Under the condition's lock, against Destroy, an operation added (arm) and a
		// launch node by node: one of them at a time runs a condition's operations.
		c.mu.Lock()
		usable := !c.destroyed.Load() && c.armed == g.armed[i] && c.trigger.Load() == 0 && c.done.Load() == 0 &&
			c.chainRun.Load() == nil && c.drivenByEngine(e)
		if usable {
			c.chainRun.Store(g)
		}
		c.mu.Unlock()
		if !usable {
			// Destroyed, failed for good, running, on another engine too: the
			// node-by-node launch does what is right for it.
			g.unchain(i)
			return false, nil
		}
	}
	defer g.unchain(len(g.conds))
	e.chainRuns.Add(1)
	defer e.chainRuns.Add(-1)
	if err := g.chain.Start(); err != nil {
		return false, nil // an endpoint closed or failed, the worker closed: likewise
	}
	err := g.chain.Wait(ctx)
	if err != nil {
		// Wait returns the run's first failure: only then has any operation one.
		for i, p := range g.opPart {
			if oerr := g.chain.OpErr(i); oerr != nil {
				p.cond.recordErr(oerr, "graph operation")
			}
		}
	}
	completed := g.chain.Iterations() == 1
	if !completed && ctx.Err() != nil {
		// Given up (the launch's stream closed): the run stops, its pending operations
		// canceled, rather than post later layers on its own. The chain can run no more.
		_ = g.chain.Destroy()
	}
	e.Release() // as a driver does when it stops: work the run saw arrive is the engine's
	if completed {
		return true, nil // failures, if any, are the conditions' (as node by node)
	}
	if err == nil {
		err = ErrClosed
	}
	return true, fmt.Errorf("chained launch stopped: %w", err)
}

// unchain ends the chained run of the first n conditions; a launch node by node that
// stored a trigger meanwhile (the engine left it for after the chain) is kicked.
func (g *graphChain) unchain(n int) {
	kick := false
	for _, c := range g.conds[:n] {
		c.mu.Lock()
		c.chainRun.Store(nil)
		c.mu.Unlock()
		kick = kick || c.trigger.Load() != 0
	}
	if kick {
		g.e.Kick()
	}
}

// cancel cancels p's operation in the running chain (Op.Cancel).
func (g *graphChain) cancel(p *part) {
	for i, q := range g.opPart {
		if q == p {
			g.chain.cancelOp(i)
			return
		}
	}
}

// Close implements streamcore.ChainedLaunch.
func (g *graphChain) Close() error { return g.chain.Destroy() }

var _ streamcore.Chainer = (*Engine)(nil)
