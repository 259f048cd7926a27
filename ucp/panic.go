package ucp

import (
	"fmt"
	"os"
	"runtime/debug"
	"sync"

	"github.com/ucpx/ucpx/internal/errs"
)

// User callbacks (Request callbacks, active-message handlers, endpoint error handlers
// and failure hooks) run on whatever goroutine drove progress. A panic in one would
// kill the process from inside a library call; it is recovered instead, reported on
// standard error and kept for RecoveredPanics, and the remaining callbacks still run.

// ErrPanic is matched by a PanicError.
var ErrPanic = errs.New("ucp: user callback panicked")

// PanicError is a panic recovered from a user callback.
type PanicError struct {
	Value any
	Stack []byte
}

func (e *PanicError) Error() string { return fmt.Sprintf("ucp: user callback panicked: %v", e.Value) }

// Is makes errors.Is(err, ErrPanic) hold.
func (e *PanicError) Is(target error) bool { return target == ErrPanic }

var panics struct {
	mu   sync.Mutex
	errs []error
}

// RecoveredPanics returns (and forgets) the panics recovered from user callbacks
// since the last call; at most the latest 64 are kept.
func RecoveredPanics() []error {
	panics.mu.Lock()
	defer panics.mu.Unlock()
	out := panics.errs
	panics.errs = nil
	return out
}

func runRecovered(f func()) {
	defer func() {
		if v := recover(); v != nil {
			e := &PanicError{Value: v, Stack: debug.Stack()}
			fmt.Fprintf(os.Stderr, "%v (recovered)\n", e)
			panics.mu.Lock()
			if len(panics.errs) >= 64 {
				panics.errs = panics.errs[1:]
			}
			panics.errs = append(panics.errs, e)
			panics.mu.Unlock()
		}
	}()
	f()
}
