// Package testenv holds what ucpx's tests share: the GPU-required helper (skip where
// no CUDA driver is present, fail where UCPX_REQUIRE_GPU=1 says one must be) and the
// fake CUDA driver (a CPU emulation of the driver API, built from C source with the
// system compiler) that exercises the CUDA code paths on machines without a GPU.
package testenv

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/ucpx/ucpx/cgo/cuda"
	"github.com/ucpx/ucpx/stream"
)

// EnvRequireGPU names the variable that turns GPU skips into failures (the GPU
// bundle's run.sh sets it).
const EnvRequireGPU = "UCPX_REQUIRE_GPU"

// GPURequired reports whether UCPX_REQUIRE_GPU=1.
func GPURequired() bool { return os.Getenv(EnvRequireGPU) == "1" }

// RequireGPU loads the CUDA driver and returns device 0. It skips the test where no
// driver or device is present, unless UCPX_REQUIRE_GPU=1, and fails where the driver
// is present but unusable.
func RequireGPU(t testing.TB) cuda.Device {
	t.Helper()
	err := cuda.Load()
	if err == nil {
		var n int
		if n, err = cuda.DeviceCount(); err == nil && n == 0 {
			err = cuda.ErrNoDriver
		}
	}
	if err != nil {
		if errors.Is(err, cuda.ErrNoDriver) && !GPURequired() {
			t.Skipf("no CUDA driver: %v", err)
		}
		t.Fatalf("CUDA driver required: %v", err)
	}
	dev, err := cuda.GetDevice(0)
	if err != nil {
		t.Fatalf("device 0: %v", err)
	}
	return dev
}

// CUDABackend opens the CUDA stream backend of device 0 for the test (closed at its
// end), skipping or failing as RequireGPU does.
func CUDABackend(t testing.TB) stream.Backend {
	t.Helper()
	RequireGPU(t)
	b, err := stream.Open(stream.CUDA)
	if err != nil {
		t.Fatalf("cuda backend: %v", err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// HostBackend opens a host stream backend for the test (closed at its end).
func HostBackend(t testing.TB) stream.Backend {
	t.Helper()
	b, err := stream.Open(stream.Host)
	if err != nil {
		t.Fatalf("host backend: %v", err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// FakeDriverSource is the fake driver's C source, relative to the module root.
const FakeDriverSource = "cgo/cuda/testdata/fakecuda/fakecuda.c"

// BuildFakeDriver compiles the fake CUDA driver into dir/libcuda.so.1 and returns dir,
// for a child process run with LD_LIBRARY_PATH=dir. It skips the test where there is
// no C compiler.
func BuildFakeDriver(t testing.TB, dir string) string {
	t.Helper()
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "gcc"
	}
	if _, err := exec.LookPath(cc); err != nil {
		t.Skip("no C compiler to build the fake driver")
	}
	root := moduleRoot(t)
	out, err := exec.Command(cc, "-shared", "-fPIC", "-O1", "-I", filepath.Join(root, "cgo", "cuda"),
		"-o", filepath.Join(dir, "libcuda.so.1"), filepath.Join(root, FakeDriverSource), "-lpthread").CombinedOutput()
	if err != nil {
		t.Fatalf("building the fake driver: %v\n%s", err, out)
	}
	return dir
}

// moduleRoot is the directory of go.mod, found from this file's location.
func moduleRoot(t testing.TB) string {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("cannot locate the module root")
	}
	return filepath.Join(filepath.Dir(file), "..", "..")
}
