package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/ucpx/ucpx/trace"
)

// checkWritable tells, before a run, whether path can be written at its end (--trace,
// --plot, UCPX_TRACE): an existing file must open for writing (it is left as it is),
// a missing one must be creatable (it is created, then removed). A directory, a
// missing folder or a read-only place is an error that names path.
func checkWritable(path string) error {
	st, err := os.Stat(path)
	switch {
	case err == nil && st.IsDir():
		return fmt.Errorf("%s is a directory, not a file", path)
	case err == nil:
		f, err := os.OpenFile(path, os.O_WRONLY, 0)
		if err != nil {
			return err
		}
		return f.Close()
	case errors.Is(err, fs.ErrNotExist):
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if err != nil {
			return err
		}
		_ = f.Close()
		return os.Remove(path)
	default:
		return err
	}
}

// checkTraceEnv checks the file UCPX_TRACE names, which the engines write as they
// close (and whose write errors only the trace package sees).
func checkTraceEnv() error {
	r := trace.FromEnv()
	if r == nil || r.Path() == "" {
		return nil
	}
	if err := checkWritable(r.Path()); err != nil {
		return fmt.Errorf("%s: %w", trace.EnvFile, err)
	}
	return nil
}

// checkTraceOutput checks, before a run, the trace file written at its end: --trace's
// (flag, "{pid}" expanded) where given, else UCPX_TRACE's.
func checkTraceOutput(flag string) error {
	if flag == "" {
		return checkTraceEnv()
	}
	if err := checkWritable(trace.ExpandPID(flag)); err != nil {
		return fmt.Errorf("--trace: %w", err)
	}
	return nil
}

// startTrace makes a recorder the process's for --trace (flag not empty): the engines
// record into it, and the caller writes it once, to trace.ExpandPID(flag), when it is done.
// stop ends that; with no flag, rec is nil and stop does nothing.
func startTrace(flag string) (rec *trace.Recorder, stop func()) {
	if flag == "" {
		return nil, func() {}
	}
	rec = trace.NewRecorder()
	trace.Use(rec)
	return rec, func() { trace.Use(nil) }
}
