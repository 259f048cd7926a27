package cuda

// Internals exposed to the external tests.
var (
	LoadLibrary  = load
	ErrNoLibrary = errNoLibrary
)

// LaunchHostNoop exposes the C no-op host function launch to the benchmarks.
func (s *Stream) LaunchHostNoop() error { return s.launchHostNoop() }

// LaunchKernelRepeatC exposes the C launch loop to the benchmarks.
func (s *Stream) LaunchKernelRepeatC(f *Function, grid, block uint32, n int, args ...any) error {
	return s.launchKernelRepeatC(f, grid, block, n, args...)
}
