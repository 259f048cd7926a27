package cuda

// Internals exposed to the external tests.
var (
	LoadLibrary  = load
	ErrNoLibrary = errNoLibrary
)

// LaunchHostNoop exposes the C no-op host function launch to the benchmarks.
func (s *Stream) LaunchHostNoop() error { return s.launchHostNoop() }
