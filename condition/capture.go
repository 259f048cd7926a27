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
// c.Destroy destroys it, and nothing earlier does (ucpx is not told when the captured
// graph and its executable graphs are destroyed, and their nodes name its words), so
// it lives as long as c. The nodes stay in the capture: call it only once the
// operation was accepted (planned), so that a refused call records nothing. Where the
// stream takes some of the nodes and refuses the next, the capture cannot be used
// (abandonCaptureLocked).
func (c *Condition) capture() (*Condition, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.destroyed.Load() {
		return nil, fmt.Errorf("capture: %w", ErrDestroyed)
	}
	// The words first, then the nodes: nodes the capture took name the words, which
	// must then outlive them.
	g, err := Create(Param{Category: Graph, Backend: c.backend, Graph: captureBuilder{c.stream}})
	if err != nil {
		return nil, err
	}
	if recorded, err := g.recordCapture(c.stream); err != nil {
		if recorded == 0 {
			_ = g.words.Close()
			return nil, fmt.Errorf("capture: %w", err)
		}
		return nil, c.abandonCaptureLocked(g, recorded, err)
	}
	c.captured = append(c.captured, g)
	return g, nil
}

// captureSignalNodes is the number of signal memops recordCapture enqueues.
const captureSignalNodes = 3

// recordCapture enqueues g's signal memops [store 1 into T, wait until D & 1, store 0
// into D] on the capturing stream s, which records them as nodes after the capture's
// current end. It reports how many the stream took before one was refused.
func (g *Condition) recordCapture(s streamcore.Stream) (int, error) {
	if err := s.WriteValue(g.trigger, 1); err != nil {
		return 0, err
	}
	// AND 1: released by 1 (done) and by GraphFailed (all ones), as graph nodes are.
	if err := s.WaitValue(g.done, 1, streamcore.AND); err != nil {
		return 1, err
	}
	if err := s.WriteValue(g.done, 0); err != nil {
		return 2, err
	}
	return captureSignalNodes, nil
}

// abandonCaptureLocked answers a capture whose stream took the first recorded of g's
// signal memops and refused the next (cause). The capture keeps the nodes it took,
// which name g's words: the capture API removes no node of a graph while it is being
// captured (cuStreamGetCaptureInfo: every operation but destroy and node removal is
// permitted), and the operation will not be attached. So g is failed for good (its
// completion word GraphFailed: a completion wait the capture took passes at once,
// and Destroy frees the words), and c keeps it, so that the words live as long as
// those of c's captured operations, rather than being freed under the nodes. Then the
// capture is invalidated where the driver allows: the stream is queried, which a
// capture does not permit, so the driver invalidates it and its EndCapture gives no
// graph. A capture still active after that (a driver that answered the query) holds
// the nodes: the error says to discard its graph, whose launches would run without
// the operation. Caller holds c.mu.
func (c *Condition) abandonCaptureLocked(g *Condition, recorded int, cause error) error {
	err := fmt.Errorf("capture: the stream refused signal memop %d of %d of the operation after the capture took %d, which a capture cannot remove: %w",
		recorded+1, captureSignalNodes, recorded, cause)
	g.fail(err)
	c.captured = append(c.captured, g)
	_, _ = c.stream.Query() // not permitted during capture: the driver invalidates it
	if capturing, qerr := c.stream.Capturing(); qerr == nil && capturing {
		return fmt.Errorf("%w; the capture is still active: discard the graph it gives (its launches would run without the operation)", err)
	}
	return fmt.Errorf("%w; the capture is invalidated: end it (it gives no graph) and capture again", err)
}

// captureBuilder is the graph of a captured operation's condition: it adds no node at
// Create (recordCapture enqueues the signal memops on the capturing stream once the
// condition's words exist).
type captureBuilder struct{ s streamcore.Stream }

func (b captureBuilder) Kind() streamcore.Kind { return b.s.Kind() }

func (b captureBuilder) AddSignalNodes(deps []Node, _, _ *streamcore.Word, split bool) (start, wait Node, err error) {
	if len(deps) > 0 || split {
		return nil, nil, fmt.Errorf("captured operation with dependencies or split: %w", ErrInvalidParam)
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
