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
