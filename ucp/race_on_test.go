//go:build race

package ucp

// raceEnabled: the race detector is on (it allocates in instrumented code).
const raceEnabled = true
