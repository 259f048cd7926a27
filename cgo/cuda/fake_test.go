package cuda_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ucpx/ucpx/cgo/cuda"
)

// fakeDriverTests are the GPU tests the fake driver (testdata/fakecuda) can
// serve: everything but IPC across processes, peer access and the driver's own
// validation of memory kinds.
const fakeDriverTests = "^(TestDeviceInfo|TestPrimaryContext|TestContextPerCall|TestStreamLifecycle|TestMemops64|TestMemops32|" +
	"TestBatchMemOp|TestStreamWaitEvent|TestEvents|TestMemory|TestLaunchHostFunc|TestGraphMemops1000|TestGraphNodeKinds|" +
	"TestGraphExecUpdate|TestStreamCapture|TestModuleKernels|TestModuleBadImage|TestKernelEcho|TestKernelDeviceHandle|" +
	"TestGraphKernelNode)$"

// buildFakeDriver compiles testdata/fakecuda into dir/libcuda.so.1.
func buildFakeDriver(t *testing.T, dir string) {
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
	out, err := exec.Command(cc, "-shared", "-fPIC", "-O1", "-I.", "-o", filepath.Join(dir, "libcuda.so.1"),
		"testdata/fakecuda/fakecuda.c", "-lpthread").CombinedOutput()
	if err != nil {
		t.Fatalf("building the fake driver: %v\n%s", err, out)
	}
}

// TestFakeDriver runs the GPU tests in a child process whose libcuda.so.1 is a
// CPU emulation of the driver. It exercises the loader, the C helpers, the
// argument layouts and the tests' own logic where there is no GPU; it proves
// nothing about real GPUs, which the device run covers.
func TestFakeDriver(t *testing.T) {
	if cuda.Load() == nil {
		t.Skip("a real driver is loaded: the GPU tests run against it")
	}
	dir := t.TempDir()
	buildFakeDriver(t, dir)
	ptx := filepath.Join(dir, "fake.ptx")
	must(t, os.WriteFile(ptx, []byte(".version 6.3\n.target sm_75\n.address_size 64\n.visible .entry ucpx_fake()\n{\n\tret;\n}\n"), 0o644))
	cmd := exec.Command(os.Args[0], "-test.run="+fakeDriverTests, "-test.v", "-test.count=1", "-test.timeout=5m")
	cmd.Env = append(os.Environ(),
		"LD_LIBRARY_PATH="+dir+":"+os.Getenv("LD_LIBRARY_PATH"),
		"UCPX_TEST_PTX="+ptx,
		EnvRequireGPU+"=1", // a skip in the child is a failure here
	)
	out, err := cmd.CombinedOutput()
	text := string(out)
	if err != nil || !strings.Contains(text, "\nPASS") {
		t.Fatalf("GPU tests against the fake driver: %v\n%s", err, text)
	}
	if strings.Contains(text, "--- SKIP") {
		t.Fatalf("tests skipped under the fake driver:\n%s", text)
	}
	t.Logf("%d GPU tests passed against the fake driver", strings.Count(text, "--- PASS"))
}
