// Package backoff paces host waits for completions that nothing signals: a copy
// engine's copy, a GPU's store into host memory, a peer's one-sided write. Such a wait
// can only poll. It spins, yielding to other goroutines, for SpinFor, then sleeps a
// millisecond per poll: on Linux a Go process with nothing else to run sleeps about a
// millisecond however short the sleep asked for (the runtime waits in epoll_wait,
// whose timeout is in milliseconds), so a shorter sleep would cost the same and only
// look shorter. Spinning for as long as one sleep costs keeps a wait that ends during
// the spin free of that millisecond, and a longer one within twice its length.
package backoff

import (
	"runtime"
	"time"
)

// SpinFor is how long a wait yields between polls before it sleeps.
const SpinFor = time.Millisecond

// Spinning reports whether a wait that started at start is still in its spin phase.
func Spinning(start time.Time) bool { return time.Since(start) < SpinFor }

// Pause paces the next poll of a wait that started at start: a yield while it is
// spinning, then a sleep of a millisecond.
func Pause(start time.Time) { PauseOn(start, sleepMillisecond) }

// PauseOn is Pause whose sleep is sleep (a millisecond at most), for a wait that
// something may also end early: a worker's event fd, for what UCX delivers.
func PauseOn(start time.Time, sleep func()) {
	if Spinning(start) {
		runtime.Gosched()
		return
	}
	sleep()
}

func sleepMillisecond() { time.Sleep(time.Millisecond) }
