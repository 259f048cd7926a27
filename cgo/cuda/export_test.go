package cuda

// Internals exposed to the external tests.
var (
	LoadLibrary  = load
	ErrNoLibrary = errNoLibrary
)
