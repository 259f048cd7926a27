package cuda_test

import (
	"os"
	"testing"

	"github.com/ucpx/ucpx/cgo/cuda"
)

var heldContext *cuda.Context

func TestMain(m *testing.M) {
	if os.Getenv(envIPCChild) == "1" {
		os.Exit(ipcChild())
	}
	// Hold device 0's primary context for the whole run, so tests that retain
	// and release it do not recreate it each time (slow) and a test that fails
	// with work still blocked never tears the context down under it.
	if cuda.Load() == nil {
		if n, err := cuda.DeviceCount(); err == nil && n > 0 {
			if d, err := cuda.GetDevice(0); err == nil {
				heldContext, _ = d.RetainPrimaryContext() // released by process exit

			}
		}
	}
	os.Exit(m.Run())
}
