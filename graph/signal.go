package graph

import (
	"fmt"

	"github.com/ucpx/ucpx/condition"
	"github.com/ucpx/ucpx/internal/errs"
	"github.com/ucpx/ucpx/stream"
)

// ErrOperationFailed is returned by a graph's wait node when the operation can run no
// more (its worker closed); the launch fails instead of hanging. It matches ErrClosed.
var ErrOperationFailed = errs.New("graph: communication operation failed permanently", errs.Closed)

// ErrNoOperation fails a launch that reaches a communication node whose condition
// carries no operation (none was enqueued with it as RequestParam.Condition): nothing
// would ever complete the node. It matches ErrInvalidParam.
var ErrNoOperation = errs.New("graph: communication node without an operation", errs.InvalidParam)

// checkSignalWords refuses the words of a communication operation that no launch
// could use: nil words, the same word twice (ErrInvalidParam), and words of a freed
// block (ErrClosed), as the streams refuse them.
func checkSignalWords(op string, trigger, done *stream.Word) error {
	for _, w := range []struct {
		name string
		w    *stream.Word
	}{{"trigger", trigger}, {"completion", done}} {
		switch {
		case !w.w.Valid():
			return fmt.Errorf("%s: nil %s word: %w", op, w.name, ErrInvalidParam)
		case w.w.Block().Closed():
			return fmt.Errorf("%s: %s word of a freed block: %w", op, w.name, ErrClosed)
		}
	}
	if trigger == done {
		return fmt.Errorf("%s: the trigger word is the completion word: %w", op, ErrInvalidParam)
	}
	return nil
}

// AddSignalNodes implements condition.GraphBuilder for host graphs: the trigger store
// and the completion wait of one communication operation, as host tasks. Nil words,
// one word as both (ErrInvalidParam) and words of a freed block (ErrClosed) are
// refused.
func (g *Host) AddSignalNodes(deps []condition.Node, trigger, done *stream.Word, split bool) (start, wait condition.Node, err error) {
	const op = "add signal nodes"
	if err := checkSignalWords(op, trigger, done); err != nil {
		return nil, nil, err
	}
	hd, err := hostNodes(op, deps)
	if err != nil {
		return nil, nil, err
	}
	// The launch kicks the trigger's block once it has stored every trigger that became
	// ready together: one round then issues them all.
	fire := func() error {
		// Destroy a graph condition only after the graphs using it are closed; a launch
		// after that finds the words gone.
		if !trigger.TryStore(1) {
			return fmt.Errorf("trigger word freed (condition destroyed): %w", ErrClosed)
		}
		return nil
	}
	words := opWords{trigger, done}
	if !split {
		n, err := g.add(op, hd, HostNode{task: fire, inline: true, trigger: trigger, waitFor: done, op: words})
		if err != nil {
			return nil, nil, err
		}
		return n, n, nil
	}
	s, err := g.add(op, hd, HostNode{task: fire, inline: true, trigger: trigger, op: words})
	if err != nil {
		return nil, nil, err
	}
	w, err := g.add(op, []*HostNode{s}, HostNode{task: func() error { return nil }, inline: true, waitFor: done, op: words})
	if err != nil {
		return nil, nil, err
	}
	return s, w, nil
}

var _ condition.GraphBuilder = (*Host)(nil)
