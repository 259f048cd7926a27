package main

import (
	"os"

	"golang.org/x/sys/unix"
)

// ucxLogFileEnv is UCX's knob for where it logs (UCX_LOG_FILE: a file name, or
// "stdout" or "stderr"). Unset, UCX logs to the C stdout stream, fd 1.
const ucxLogFileEnv = "UCX_LOG_FILE"

// ucxLogToStderr keeps UCX's log lines (WARN, ERROR) off the command's output, which
// --json and --csv promise to be nothing but the report: unless the user set
// UCX_LOG_FILE, fd 1 becomes a copy of stderr, where UCX's stdout stream (and any other
// C code's) now writes, and os.Stdout moves to a new descriptor for the original
// stdout. UCX reads UCX_LOG_FILE when libucs loads, before Go runs, so setting it now
// would change nothing. It returns the stdout the command writes its output to.
func ucxLogToStderr() *os.File {
	if _, set := os.LookupEnv(ucxLogFileEnv); set {
		return os.Stdout
	}
	out, err := unix.FcntlInt(1, unix.F_DUPFD_CLOEXEC, 3)
	if err != nil {
		return os.Stdout // fd 1 closed: nothing to keep apart
	}
	if err := unix.Dup3(2, 1, 0); err != nil {
		_ = unix.Close(out)
		return os.Stdout
	}
	os.Stdout = os.NewFile(uintptr(out), "/dev/stdout")
	return os.Stdout
}
