package graph

import (
	"errors"
	"fmt"

	"github.com/ucpx/ucpx/condition"
	"github.com/ucpx/ucpx/stream"
)

// ErrOperationFailed is returned by a graph's wait node when the operation can run no
// more (its worker closed); the launch fails instead of hanging.
var ErrOperationFailed = errors.New("graph: communication operation failed permanently")

// AddSignalNodes implements condition.GraphBuilder for host graphs: the trigger store
// and the completion wait of one communication operation, as host tasks.
func (g *Host) AddSignalNodes(deps []any, trigger, done *stream.Word, split bool) (start, wait any, err error) {
	hd := make([]*HostNode, 0, len(deps))
	for _, d := range deps {
		n, ok := d.(*HostNode)
		if !ok {
			return nil, nil, fmt.Errorf("dependency %T is not a host graph node: %w", d, ErrInvalidParam)
		}
		hd = append(hd, n)
	}
	fire := func() error {
		// Destroy a graph condition only after the graphs using it are closed; a launch
		// after that finds the words gone.
		if trigger.Block().Closed() {
			return fmt.Errorf("trigger word freed (condition destroyed): %w", ErrClosed)
		}
		trigger.Store(1)
		trigger.Block().Kick()
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return nil, nil, fmt.Errorf("add signal nodes: %w", ErrClosed)
	}
	for _, d := range hd {
		if d.g != g {
			return nil, nil, fmt.Errorf("add signal nodes: dependency from another graph: %w", ErrInvalidParam)
		}
	}
	add := func(deps []*HostNode, task func() error, waitFor *stream.Word) *HostNode {
		n := &HostNode{g: g, id: len(g.nodes), deps: deps, task: task, inline: true, waitFor: waitFor}
		g.nodes = append(g.nodes, n)
		return n
	}
	if !split {
		n := add(hd, fire, done)
		return n, n, nil
	}
	s := add(hd, fire, nil)
	w := add([]*HostNode{s}, func() error { return nil }, done)
	return s, w, nil
}

var _ condition.GraphBuilder = (*Host)(nil)
