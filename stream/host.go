package stream

import (
	"errors"
	"fmt"
	"sync"
	"time"
)

// DefaultCloseGrace is how long a closing host stream lets a blocked wait (WaitValue,
// WaitEvent) keep waiting before it abandons it and the work behind it. Waits that an
// active proxy answers finish in microseconds; a wait still blocked this long after
// Close has almost certainly lost the agent that was meant to satisfy it.
const DefaultCloseGrace = 100 * time.Millisecond

// ErrAbandoned is the sticky error of a host stream whose Close gave up on a wait that
// did not hold within the close grace period; the work queued behind that wait was
// dropped, never run. It wraps ErrClosed, so errors.Is(err, ErrClosed) holds too.
// Waiting on an event whose stream abandoned work before reaching it reports it as well.
var ErrAbandoned = fmt.Errorf("%w: pending work abandoned", ErrClosed)

// ErrGoexit is the Value of the *PanicError a host stream fails with when a host func
// calls runtime.Goexit (t.FailNow in a test callback, for one): errors.Is(err,
// ErrGoexit) and errors.As(err, **PanicError) both hold for it.
var ErrGoexit = errors.New("stream: host func called runtime.Goexit")

// PanicError is the sticky error of a host stream whose LaunchHostFunc callback
// panicked (or called runtime.Goexit: Value is then ErrGoexit). The stream fails like a CUDA stream after a sticky error: the queued work
// behind the callback is dropped and every later call returns this error. Error()
// is one line; the stack is in Stack for whoever wants to log it.
type PanicError struct {
	Value any    // the value passed to panic
	Stack []byte // the executor goroutine's stack at the panic (runtime/debug.Stack)
}

func (e *PanicError) Error() string {
	return fmt.Sprintf("stream: host func panicked: %v", e.Value)
}

// Unwrap returns the panic value when it is an error, so errors.Is sees through it.
func (e *PanicError) Unwrap() error {
	if err, ok := e.Value.(error); ok {
		return err
	}
	return nil
}

// HostOption configures NewHostBackend.
type HostOption func(*hostConfig)

type hostConfig struct {
	closeGrace time.Duration
}

// WithCloseGrace sets how long Close lets a blocked wait keep waiting before abandoning
// it (see DefaultCloseGrace). Zero abandons a blocked wait at once; negative values
// count as zero.
func WithCloseGrace(d time.Duration) HostOption {
	return func(c *hostConfig) { c.closeGrace = max(d, 0) }
}

// hostBackend creates host streams, host events and signal words in C memory.
type hostBackend struct {
	cfg hostConfig

	mu      sync.Mutex
	closed  bool
	streams map[*hostStream]struct{} // open streams, closed by Close
}

// NewHostBackend returns the host backend: streams are serial CPU executors (one
// goroutine each), events are positions in those streams, and signal words live in C
// memory so that C threads may hold their addresses.
func NewHostBackend(opts ...HostOption) Backend {
	cfg := hostConfig{closeGrace: DefaultCloseGrace}
	for _, o := range opts {
		o(&cfg)
	}
	return &hostBackend{cfg: cfg, streams: make(map[*hostStream]struct{})}
}

func (b *hostBackend) Kind() Kind { return KindHost }

func (b *hostBackend) NewStream() (Stream, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, fmt.Errorf("stream: host backend: %w", ErrClosed)
	}
	s := newHostStream(b, b.cfg)
	b.streams[s] = struct{}{}
	return s, nil
}

func (b *hostBackend) NewEvent() (Event, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, fmt.Errorf("stream: host backend: %w", ErrClosed)
	}
	return &hostEvent{}, nil
}

// AllocWords allocates n zeroed words in C memory, aligned to a cache line. The block
// outlives the backend: its owner closes it, after the last stream that uses it is done.
func (b *hostBackend) AllocWords(n int) (*WordBlock, error) {
	b.mu.Lock()
	closed := b.closed
	b.mu.Unlock()
	if closed {
		return nil, fmt.Errorf("stream: host backend: %w", ErrClosed)
	}
	if n <= 0 || n > maxHostWords {
		return nil, fmt.Errorf("stream: host AllocWords(%d): %w", n, ErrInvalidArgument)
	}
	p, err := cAllocWords(n)
	if err != nil {
		return nil, err
	}
	free := func() error {
		// WordBlock.Close marked the block freed before calling us; wait until no
		// host executor is between its "block still open?" check and its access,
		// so none can touch the memory after it is returned to C.
		quiesceWordAccess()
		cFree(p)
		return nil
	}
	return NewWordBlock(KindHost, p, 0, n, free), nil
}

// maxHostWords bounds AllocWords so that n*8 cannot overflow and a typo cannot ask for
// terabytes.
const maxHostWords = 1 << 30

// Close closes every stream of the backend (each with its close grace, all at once) and
// refuses new objects. Events and word blocks stay usable. It returns the streams'
// sticky errors, joined; a second Close returns ErrClosed. Called from a host func of
// one of its streams (Close would wait for that func), or of another backend's host
// stream that one of them waits for past that func, it refuses with an error
// wrapping ErrInvalidArgument and closes nothing.
func (b *hostBackend) Close() error {
	// Close waits for every stream's executor: from a host func of one of them it
	// would wait for itself forever, and from a host func of another backend's stream
	// that one of them waits for, for each other. Refuse before closing anything.
	from := callingExecutor()
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return fmt.Errorf("stream: host backend: %w", ErrClosed)
	}
	if from != nil && from.backend == b {
		b.mu.Unlock()
		return errOwnExecutor("Backend.Close")
	}
	streams := make([]*hostStream, 0, len(b.streams))
	for s := range b.streams {
		streams = append(streams, s)
	}
	if from != nil {
		for _, s := range streams {
			if wouldCycle(from, s) {
				b.mu.Unlock()
				return errWaitCycle("Backend.Close", from, s)
			}
		}
	}
	b.closed = true
	b.mu.Unlock()

	// Start every close before waiting on any, so grace periods run in parallel and a
	// stream waiting on another's event sees that one finish. Streams a caller is
	// closing concurrently are waited for too, so no executor outlives this call.
	mine := make([]bool, len(streams))
	for i, s := range streams {
		mine[i] = s.beginClose()
	}
	var errs []error
	for i, s := range streams {
		var e *waitEdge
		if from != nil {
			// Registered for the cycle checks of other waits; a cycle closing on it
			// now is ended by the close grace, as any wait that does not hold.
			e, _ = beginWait(from, s, ^uint64(0), false, false)
		}
		<-s.done
		if e != nil {
			endWait(from, e)
		}
		if !mine[i] {
			continue
		}
		b.forget(s)
		if err := s.err(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// forget drops a closed stream from the backend's set.
func (b *hostBackend) forget(s *hostStream) {
	b.mu.Lock()
	delete(b.streams, s)
	b.mu.Unlock()
}
