//go:build race

package streamcore

import (
	"runtime"
	"unsafe"
)

// Under the race detector a Word carries a byte of Go memory that stands for it.
//
// Go's race detector sees sync/atomic operations only on Go memory; on the C memory of
// a word (C, pinned host memory) it performs them with synchronization ignored. So the
// orderings a word carries — a stream's trigger store before the engine issues the
// operation, the engine's completion store before a stream's wait and what follows
// it, a graph condition's completion store before the host graph's wait node — would
// be invisible, and a correct program would get race reports. Every store to a word
// therefore releases on the word's stand-in first, and every load acquires on it
// after, which makes each ordering the word carries an edge the detector sees.
type raceSync struct{ _ byte }

// raceRelease runs before a store to the word: whoever later loads the stored value
// (raceAcquire) is ordered after everything the storing goroutine did so far. Merge,
// not overwrite: several goroutines store into one word (trigger stores by a stream
// and the engine's reset, completion stores by whichever goroutine runs the round).
func (w *Word) raceRelease() { runtime.RaceReleaseMerge(unsafe.Pointer(&w.race)) }

// raceAcquire runs after a load of the word.
func (w *Word) raceAcquire() { runtime.RaceAcquire(unsafe.Pointer(&w.race)) }
