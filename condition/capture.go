package condition

import (
	"fmt"

	"github.com/ucpx/ucpx/stream/streamcore"
)

// Stream capture: frameworks build CUDA graphs by capturing a stream. An operation
// enqueued with a Stream condition while the condition's stream captures cannot use
// the condition's sequence numbers (the captured memops keep their values and the
// graph relaunches), so it becomes a persistent graph operation: capture adds its
// signal nodes [store 1 into T', wait until D' & 1, store 0 into D'] to the capture,
// on words of its own, and returns the Graph condition that carries it. Every launch
// of the captured graph performs the operation again; stream order inside the graph
// is the capture's order.

// capturing reports whether c is a Stream condition whose stream is capturing a
// graph: the operation about to be enqueued then becomes a persistent graph operation
// (capture). streamOrdered false (a non-blocking enqueue) is refused under capture: its
// later wait would have no sequence number to wait for in a relaunched graph.
func (c *Condition) capturing(streamOrdered bool) (bool, error) {
	if c.category != Stream {
		return false, nil
	}
	// Every enqueue asks (one driver call on CUDA, none on host streams). The capturing
	// thread is the enqueuing one, so the answer holds until the operation is armed.
	capturing, err := c.stream.Capturing()
	if err != nil || !capturing {
		return false, err
	}
	if !streamOrdered {
		return false, fmt.Errorf("non-blocking enqueue while the stream captures a graph: %w", ErrInvalidParam)
	}
	return true, nil
}

// capture returns a new Graph condition whose nodes were just captured on c's stream
// (capturing reported true), for the one operation about to be enqueued. c owns it:
// c.Destroy destroys it. The nodes stay in the capture: call it only once the
// operation was accepted (planned), so that a refused call records nothing.
func (c *Condition) capture() (*Condition, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.destroyed.Load() {
		return nil, fmt.Errorf("capture: %w", ErrDestroyed)
	}
	g, err := Create(Param{Category: Graph, Backend: c.backend, Graph: captureBuilder{c.stream}})
	if err != nil {
		return nil, err
	}
	c.captured = append(c.captured, g)
	return g, nil
}

// captureBuilder adds a graph condition's nodes by enqueuing its signal memops on a
// capturing stream, which records them as nodes after the capture's current end.
type captureBuilder struct{ s streamcore.Stream }

func (b captureBuilder) Kind() streamcore.Kind { return b.s.Kind() }

func (b captureBuilder) AddSignalNodes(deps []Node, trigger, done *streamcore.Word, split bool) (start, wait Node, err error) {
	if len(deps) > 0 || split {
		return nil, nil, fmt.Errorf("captured operation with dependencies or split: %w", ErrInvalidParam)
	}
	if err := b.s.WriteValue(trigger, 1); err != nil {
		return nil, nil, err
	}
	// AND 1: released by 1 (done) and by GraphFailed (all ones), as graph nodes are.
	if err := b.s.WaitValue(done, 1, streamcore.AND); err != nil {
		return nil, nil, err
	}
	if err := b.s.WriteValue(done, 0); err != nil {
		return nil, nil, err
	}
	return nil, nil, nil
}

// destroyCapturedLocked destroys the graph conditions of captured operations; the
// first that a launch is still running keeps c alive (ErrBusy). Caller holds c.mu.
func (c *Condition) destroyCapturedLocked() error {
	kept := c.captured[:0]
	var first error
	for _, g := range c.captured {
		if g.destroyed.Load() {
			continue
		}
		if err := g.Destroy(); err != nil {
			kept = append(kept, g)
			if first == nil {
				first = fmt.Errorf("captured operation: %w", err)
			}
		}
	}
	c.captured = kept
	return first
}
