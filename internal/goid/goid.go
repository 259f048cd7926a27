// Package goid tells which goroutine is running: a goroutine that runs user callbacks
// (a worker's progress thread, an engine's goroutine) must not wait for its own exit
// when a callback closes what it serves. Go exposes no goroutine id; the first line of
// the goroutine's own stack trace ("goroutine 42 [running]:") carries it. A call costs
// about a microsecond: use it on close paths, not per operation.
package goid

import "runtime"

// Current returns the calling goroutine's id, or 0 where the trace's header is not
// the expected one (a runtime that changed it): callers then take every goroutine for
// another one (Is).
func Current() uint64 {
	var buf [64]byte
	b := buf[:runtime.Stack(buf[:], false)]
	const prefix = "goroutine "
	if len(b) < len(prefix) || string(b[:len(prefix)]) != prefix {
		return 0
	}
	var id uint64
	for _, c := range b[len(prefix):] {
		if c < '0' || c > '9' {
			break
		}
		id = id*10 + uint64(c-'0')
	}
	return id
}

// Is reports whether the calling goroutine is the one whose id was recorded (0: none,
// or unknown).
func Is(id uint64) bool { return id != 0 && Current() == id }
