package graph

// ChainedStarts is the number of nodes of x's launches whose trigger the engine stored
// when their dependency completed (the launch skipped their tasks).
func ChainedStarts(x *HostExec) uint64 { return x.chainedStarts.Load() }

// ChainedLaunches is the number of x's launches run as one completion chain.
func ChainedLaunches(x *HostExec) uint64 { return x.chainedLaunches.Load() }

// ChainHeld reports, through a function that keeps x itself unreachable, whether x's
// prepared launch chain is held (made and not released).
func ChainHeld(x *HostExec) func() bool {
	c := x.chain
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.run != nil
	}
}

// CompletionTail is the handle of the completion node that the next communication
// node added through c waits after (the tail of its CUgraph's chain), 0 if none.
func CompletionTail(c CUDA) uintptr {
	waitChains.Lock()
	defer waitChains.Unlock()
	n, ok := tailLocked(c.Graph, c.Graph.Handle())
	if !ok {
		return 0
	}
	return n.Handle()
}
