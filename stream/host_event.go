package stream

import (
	"fmt"
	"sync"
)

// hostEvent is a position in a host stream: it is done once that stream has run the
// operations enqueued before Record. It holds no goroutine or C resource.
type hostEvent struct {
	mu     sync.Mutex
	stream *hostStream // nil until recorded
	seq    uint64      // the stream's tail at Record
	closed bool
}

func errClosedEvent() error { return fmt.Errorf("stream: host event: %w", ErrClosed) }

func (e *hostEvent) record(s *hostStream, seq uint64) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return errClosedEvent()
	}
	e.stream, e.seq = s, seq
	return nil
}

// snapshot returns the most recent record (nil stream if none).
func (e *hostEvent) snapshot() (*hostStream, uint64, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil, 0, errClosedEvent()
	}
	return e.stream, e.seq, nil
}

// Query is true once the recorded work has run. If the stream failed or was closed
// with that work abandoned, the work will never run: Query returns false and the error.
func (e *hostEvent) Query() (bool, error) {
	s, seq, err := e.snapshot()
	if err != nil || s == nil {
		return err == nil, err
	}
	ok, err := s.reached(seq)
	if err != nil {
		return false, fmt.Errorf("stream: host event: recorded work will not run: %w", err)
	}
	return ok, nil
}

// Synchronize waits for the recorded work; see Query for the errors. Called from a
// host func of the recording stream, on a record after that func (which it would wait
// for forever), or from a host func of another host stream that the recording stream
// waits for past that func, it returns an error wrapping ErrInvalidArgument.
func (e *hostEvent) Synchronize() error {
	s, seq, err := e.snapshot()
	if err != nil || s == nil {
		return err
	}
	refused, err := s.callerWait("Event.Synchronize", seq)
	if refused != nil {
		return refused
	}
	if err != nil {
		return fmt.Errorf("stream: host event: recorded work will not run: %w", err)
	}
	return nil
}

func (e *hostEvent) Handle() uintptr { return 0 }

// Close releases the event; later Record, WaitEvent and queries return ErrClosed. Waits
// already enqueued on it are unaffected (they captured the position).
func (e *hostEvent) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return errClosedEvent()
	}
	e.closed, e.stream = true, nil
	return nil
}
