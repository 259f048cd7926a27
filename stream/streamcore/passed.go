package streamcore

import (
	"errors"
	"reflect"
	"slices"
	"sync/atomic"
)

// Memory that streams were given waits on (signal words) may be freed only once each of
// those streams has passed its waits. Conditions and prepared requests keep the streams
// in a StreamSet and free through AfterPassed.

// SameStream reports whether a and b are one stream (false for a type Go cannot
// compare: such a stream is then kept once per Add).
func SameStream(a, b Stream) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return reflect.TypeOf(a) == reflect.TypeOf(b) && reflect.TypeOf(a).Comparable() && a == b
}

// Finished reports whether s will run no more work: closed (a CUDA stream's Close
// synchronized it), or a host stream stopped on an error.
func Finished(s Stream) bool {
	_, err := s.Query()
	return err != nil && (errors.Is(err, ErrClosed) || s.Kind() == KindHost)
}

// StreamSet is the streams given waits on some memory, each once. The zero value is
// empty.
type StreamSet struct{ list []Stream }

// pruneStreamsAt: a set this long forgets the streams that will run nothing more
// (Finished) before it adds one, so streams made and closed per iteration do not pile
// up until the memory is freed.
const pruneStreamsAt = 16

// Add records s, unless the set has it already.
func (ss *StreamSet) Add(s Stream) {
	if slices.ContainsFunc(ss.list, func(f Stream) bool { return SameStream(f, s) }) {
		return
	}
	if len(ss.list) >= pruneStreamsAt {
		ss.list = slices.DeleteFunc(ss.list, Finished)
	}
	ss.list = append(ss.list, s)
}

// Streams returns the streams (the set's own slice: append to a slices.Clip of it).
func (ss *StreamSet) Streams() []Stream { return ss.list }

// Take returns the streams and empties the set.
func (ss *StreamSet) Take() []Stream {
	l := ss.list
	ss.list = nil
	return l
}

// AfterPassed runs fn once every host stream of streams has passed the work enqueued on
// it so far, without blocking: a host function on each, the last of which runs fn on
// its stream's executor (onStream true). A stream that drops it or takes no more work
// reads no more, and counts as passed; when all have passed by the time AfterPassed
// returns, fn runs on the caller (onStream false). CUDA streams are for the caller to
// synchronize: a CUDA host function may not call CUDA.
func AfterPassed(streams []Stream, fn func(onStream bool)) {
	var left atomic.Int64
	left.Store(int64(len(streams)) + 1)
	passed := func() {
		if left.Add(-1) == 0 {
			fn(true)
		}
	}
	for _, s := range streams {
		if err := LaunchOrDrop(s, passed); err != nil {
			passed()
		}
	}
	if left.Add(-1) == 0 {
		fn(false)
	}
}
