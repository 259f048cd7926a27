package graph

import (
	"errors"
	"fmt"
	"runtime"
	"time"

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
	complete := func() error { return waitDone(done) }
	if !split {
		n, err := g.AddTask(hd, func() error {
			if err := fire(); err != nil {
				return err
			}
			return complete()
		})
		return n, n, err
	}
	s, err := g.AddTask(hd, fire)
	if err != nil {
		return nil, nil, err
	}
	w, err := g.AddTask([]*HostNode{s}, complete)
	if err != nil {
		return nil, nil, err
	}
	return s, w, nil
}

// waitDone waits until done is 1 and resets it (the graph may relaunch). It drives the
// proxy while it waits, as a host stream executor does.
func waitDone(done *stream.Word) error {
	for spins := 0; ; spins++ {
		switch done.Load() {
		case 1:
			done.Store(0)
			return nil
		case condition.GraphFailed:
			return ErrOperationFailed
		}
		if done.Block().Closed() {
			return fmt.Errorf("completion word freed: %w", ErrClosed)
		}
		if done.Block().Drive() {
			spins = 0
			continue
		}
		switch {
		case spins < 1024:
		case spins < 8192:
			runtime.Gosched()
		default:
			time.Sleep(50 * time.Microsecond)
		}
	}
}

var _ condition.GraphBuilder = (*Host)(nil)
