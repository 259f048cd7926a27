package cuda_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/internal/testenv"
)

// fakeDriverTests are the GPU tests the fake driver (testdata/fakecuda) can
// serve: everything but IPC across processes, peer access and the driver's own
// validation of memory kinds.
var fakeDriverTests = []string{"TestDeviceInfo", "TestPrimaryContext", "TestContextPerCall", "TestStreamLifecycle",
	"TestMemops64", "TestMemops32", "TestBatchMemOp", "TestStreamWaitEvent", "TestEvents", "TestMemory",
	"TestLaunchHostFunc", "TestGraphMemops1000", "TestGraphNodeKinds", "TestGraphDestroyNode", "TestGraphExecUpdate", "TestStreamCapture",
	"TestModuleKernels", "TestModuleBadImage", "TestKernelEcho", "TestKernelDeviceHandle", "TestGraphKernelNode",
	"TestAllocationOf", "TestLaunchCopy"}

// TestFakeDriver runs the GPU tests in a child process whose libcuda.so.1 is a
// CPU emulation of the driver. It exercises the loader, the C helpers, the
// argument layouts and the tests' own logic where there is no GPU; it proves
// nothing about real GPUs, which the device run covers.
func TestFakeDriver(t *testing.T) {
	// The kernel tests load this minimal module (UCPX_TEST_PTX) instead of the embedded PTX.
	ptx := filepath.Join(t.TempDir(), "fake.ptx")
	require.NoError(t, os.WriteFile(ptx, []byte(".version 6.3\n.target sm_75\n.address_size 64\n.visible .entry ucpx_fake()\n{\n\tret;\n}\n"), 0o644))
	testenv.RunUnderFakeDriver(t, fakeDriverTests, "UCPX_TEST_PTX="+ptx)
}
