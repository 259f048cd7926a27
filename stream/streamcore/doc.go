// Package streamcore is the backend-free core of package stream: the Stream, Event,
// Backend and Driver interfaces, Kind and Compare, the error sentinels, the signal
// words (Word, WordBlock) and HostStaging, the optional interface through which a
// backend classifies and stages device memory.
//
// It imports no CUDA package, so the layers written against these interfaces
// (condition, protocol, ucp) do not link the CUDA backend. Applications use package
// stream, which re-exports everything here under the same names (stream.Stream is
// streamcore.Stream) and adds the backends: NewHostBackend, Open, WrapCUDAStream and
// the CUDA accessors. See package stream for the semantics of each object.
package streamcore
