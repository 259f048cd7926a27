// Package testenv holds what ucpx's tests share about the machine they run on: the
// rule that decides whether a GPU test skips or fails (RequireGPU, SkipOrFail) and
// the fake CUDA driver (a CPU emulation of the driver API, built from C source with
// the system compiler) that exercises the CUDA code paths where there is no GPU, and
// NilMethods, the check that every method of a handle type answers a nil receiver.
//
// It imports only cgo/cuda, so the internal tests of every package above cgo/cuda
// (stream's, for one) can use it; helpers that need the stream package live in
// internal/testenv/streamenv. cgo/cuda's own tests use it from the external test
// package cuda_test.
package testenv

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/cgo/cuda"
)

// EnvRequireGPU names the variable that turns "no GPU here" skips into failures, so
// a run on the GPU machine cannot pass by skipping everything (the GPU bundle's
// run.sh sets it).
const EnvRequireGPU = "UCPX_REQUIRE_GPU"

// GPURequired reports whether UCPX_REQUIRE_GPU=1.
func GPURequired() bool { return os.Getenv(EnvRequireGPU) == "1" }

// NoGPU reports whether err (from cuda.Load, or from opening a device) says that
// this machine has no GPU: libcuda.so.1 cannot be opened, it is the toolkit's stub,
// or the driver sees no device. Any other error is a driver that is present but
// unusable, which a test reports as a failure.
func NoGPU(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, cuda.ErrNoDevice) || errors.Is(err, cuda.ErrStubLibrary) {
		return true
	}
	// cuda.Load reports a failed dlopen as "cuda: dlopen <library>: ...", wrapping
	// ErrNoDriver and no driver code (cgo/cuda's TestLoadMissingLibrary holds it to
	// that); a library that opens but lacks an entry point is not "no GPU".
	var code *cuda.Error
	return errors.Is(err, cuda.ErrNoDriver) && !errors.As(err, &code) && strings.Contains(err.Error(), "cuda: dlopen ")
}

// SkipOrFail ends a test that cannot run because of err: it skips where err says
// the machine has no GPU (NoGPU) and UCPX_REQUIRE_GPU is not 1, and fails otherwise.
func SkipOrFail(t testing.TB, err error) {
	t.Helper()
	require.Truef(t, NoGPU(err), "CUDA driver present but unusable: %v", err)
	require.Falsef(t, GPURequired(), "no GPU, and %s=1 requires one: %v", EnvRequireGPU, err)
	t.Skipf("no GPU: %v", err)
}

// RequireGPU loads the CUDA driver and returns device 0. It skips the test where the
// machine has no GPU (no libcuda.so.1, the stub library, or no device), unless
// UCPX_REQUIRE_GPU=1, and fails where a driver is present but unusable or device 0
// lacks a feature ucpx needs (64-bit stream memory operations, host-mapped memory,
// unified addressing).
func RequireGPU(t testing.TB) cuda.Device {
	t.Helper()
	if err := cuda.Load(); err != nil {
		SkipOrFail(t, err)
	}
	n, err := cuda.DeviceCount()
	require.NoError(t, err, "DeviceCount")
	if n == 0 {
		SkipOrFail(t, cuda.ErrNoDevice)
	}
	dev, err := cuda.GetDevice(0)
	require.NoError(t, err, "GetDevice(0)")
	caps, err := dev.Caps()
	require.NoError(t, err, "Caps")
	require.Truef(t, caps.StreamMemOps64 && caps.MapHostMemory && caps.UnifiedAddressing,
		"device 0 lacks a feature ucpx needs: %+v", caps)
	return dev
}

// FakeDriverSource is the fake driver's C source, relative to the module root.
const FakeDriverSource = "cgo/cuda/testdata/fakecuda/fakecuda.c"

// BuildFakeDriver compiles the fake CUDA driver into dir/libcuda.so.1 and returns dir,
// for a child process run with LD_LIBRARY_PATH=dir. It skips the test where there is
// no C compiler ($CC, cc, gcc or clang).
func BuildFakeDriver(t testing.TB, dir string) string {
	t.Helper()
	cc := ""
	for _, c := range []string{os.Getenv("CC"), "cc", "gcc", "clang"} {
		if p, err := exec.LookPath(c); c != "" && err == nil {
			cc = p
			break
		}
	}
	if cc == "" {
		t.Skip("no C compiler to build the fake driver")
	}
	root := moduleRoot(t)
	out, err := exec.Command(cc, "-shared", "-fPIC", "-O1", "-I", filepath.Join(root, "cgo", "cuda"),
		"-o", filepath.Join(dir, "libcuda.so.1"), filepath.Join(root, FakeDriverSource), "-lpthread").CombinedOutput()
	require.NoError(t, err, "building the fake driver:\n%s", out)
	return dir
}

// RunUnderFakeDriver runs the named tests of this test binary in a child process
// whose libcuda.so.1 is the fake driver, with UCPX_REQUIRE_GPU=1 (a skip there fails
// here) and env added to its environment. It skips where a real driver loads (the
// tests run against it directly), fails unless the child passes every named test and
// skips none, and returns the child's output. It proves nothing about real GPUs,
// which the GPU bundle's run covers.
func RunUnderFakeDriver(t testing.TB, tests []string, env ...string) string {
	t.Helper()
	if cuda.Load() == nil {
		t.Skip("a real CUDA driver is loaded: the GPU tests run against it")
	}
	dir := BuildFakeDriver(t, t.TempDir())
	run := "^(" + strings.Join(tests, "|") + ")$"
	cmd := exec.Command(os.Args[0], "-test.run="+run, "-test.v", "-test.count=1", "-test.timeout=5m")
	cmd.Env = append(os.Environ(), "LD_LIBRARY_PATH="+dir+":"+os.Getenv("LD_LIBRARY_PATH"), EnvRequireGPU+"=1", envFakeDriver+"=1")
	cmd.Env = append(cmd.Env, env...)
	out, err := cmd.CombinedOutput()
	text := string(out)
	require.NoError(t, err, "GPU tests against the fake driver:\n%s", text)
	require.Contains(t, text, "\nPASS", "GPU tests against the fake driver:\n%s", text)
	require.NotContains(t, text, "--- SKIP", "tests skipped under the fake driver:\n%s", text)
	for _, name := range tests {
		require.Contains(t, text, "--- PASS: "+name+" (", "%s did not run under the fake driver:\n%s", name, text)
	}
	t.Logf("%d GPU tests passed against the fake driver", strings.Count(text, "--- PASS"))
	return text
}

// envFakeDriver marks the child process RunUnderFakeDriver starts.
const envFakeDriver = "UCPX_TEST_FAKE_DRIVER"

// RequireFakeDriver skips a test that steers the fake driver (its FAKECUDA_* knobs,
// which a real driver ignores) unless RunUnderFakeDriver runs it.
func RequireFakeDriver(t testing.TB) {
	t.Helper()
	if os.Getenv(envFakeDriver) == "" {
		t.Skip("steers the fake driver: run by RunUnderFakeDriver")
	}
}

// moduleRoot is the directory that holds the fake driver's source: the module root
// this file was built from, else the nearest directory above the working directory
// that has it (the GPU bundle runs each test binary in a copy of its package's
// directory, under a copy of the tree).
func moduleRoot(t testing.TB) string {
	t.Helper()
	var candidates []string
	if _, file, _, ok := runtime.Caller(0); ok {
		candidates = append(candidates, filepath.Join(filepath.Dir(file), "..", ".."))
	}
	if wd, err := os.Getwd(); err == nil {
		for dir := wd; ; dir = filepath.Dir(dir) {
			candidates = append(candidates, dir)
			if dir == filepath.Dir(dir) {
				break
			}
		}
	}
	for _, root := range candidates {
		if _, err := os.Stat(filepath.Join(root, FakeDriverSource)); err == nil {
			return root
		}
	}
	require.FailNowf(t, "no fake driver source", "%s is neither under the module root this binary was built from nor above the working directory", FakeDriverSource)
	return ""
}
