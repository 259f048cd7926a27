//go:build !race

package streamcore

// Without the race detector the stand-in of a word (see race.go) is empty and its
// release and acquire compile to nothing.
type raceSync struct{}

func (w *Word) raceRelease() {}

func (w *Word) raceAcquire() {}
