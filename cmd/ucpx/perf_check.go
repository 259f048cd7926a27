package main

import (
	"bytes"
	"strings"

	"github.com/ucpx/ucpx/internal/pingpong"
)

// --check: both processes fill their send buffers with the same bytes (a seeded
// random fill of the same length), so a receiver knows what every message must hold
// without it travelling: its own send buffer. A +work mode's producer writes
// device.Pattern with iteration i's seed instead.

// checkRecv adds to s.wrong the bytes of got that differ from want. clearAfter wipes
// got, so that a message that never lands there shows as wrong the next time; only
// where no other receive into got is in flight.
func (s *perfSide) checkRecv(got, want []byte, clearAfter bool) {
	if n := countWrong(got, want); n > 0 {
		s.wrong.Add(n)
	}
	if clearAfter {
		clear(got)
	}
}

// countWrong counts the positions where got and want differ.
func countWrong(got, want []byte) int64 {
	if bytes.Equal(got, want) {
		return 0
	}
	var n int64
	for i := range got {
		if i >= len(want) || got[i] != want[i] {
			n++
		}
	}
	return n
}

// expectedPing is what ping i of a tag_lat phase driven by mode holds: the send
// buffer's bytes, or under +work what iteration i's producer wrote.
func (s *perfSide) expectedPing(mode string, size, i int) []byte {
	if !strings.HasSuffix(mode, workSuffix) {
		return s.smem.Bytes()[:size]
	}
	if len(s.expect) < size {
		s.expect = make([]byte, s.smem.Len())
	}
	fillPattern(s.expect[:size], pingpong.WorkSeed(i))
	return s.expect[:size]
}

// wrong is the run's total of wrong bytes (--check).
func (rep *perfReport) wrong() int64 {
	var n int64
	for _, r := range rep.Results {
		if r.Wrong != nil {
			n += *r.Wrong
		}
	}
	return n
}
