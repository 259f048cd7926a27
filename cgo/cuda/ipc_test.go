package cuda_test

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/cgo/cuda"
)

// Environment of the IPC child: the test binary re-executes itself with these.
const (
	envIPCChild  = "UCPX_TEST_IPC_CHILD"
	envIPCMem    = "UCPX_TEST_IPC_MEM"
	envIPCEvent  = "UCPX_TEST_IPC_EVENT"
	envIPCDevice = "UCPX_TEST_IPC_DEVICE"
	envIPCSize   = "UCPX_TEST_IPC_SIZE"
)

const ipcFill, ipcReply = 0x6b, 0xc3

// TestIPC shares a device allocation and an interprocess event with a child
// process (on GPU 1 when there are two GPUs, else on GPU 0). The child waits for
// the parent's event, checks the parent's data, overwrites it and exits; the
// parent then sees the child's bytes.
func TestIPC(t *testing.T) {
	ctx := newContext(t)
	s := newStream(t, ctx)
	const n = 4 << 20
	dm := devMem(t, ctx, n)
	host := hostMem(t, ctx, n, 0)
	ev, err := ctx.NewEvent(cuda.EventInterprocess | cuda.EventDisableTiming)
	require.NoError(t, err)
	defer ev.Close()

	// The parent's write is gated, so the child must really wait on the event.
	w := newWords(t, ctx, 1)
	require.NoError(t, s.WaitValue64(w.dev(0), 1, cuda.WaitGEQ))
	defer w.store(0, 1)
	require.NoError(t, s.MemsetD8(dm.Ptr(), ipcFill, n))
	require.NoError(t, ev.Record(s))

	mh, err := ctx.IPCMemHandle(dm.Ptr())
	require.NoError(t, err)
	eh, err := ev.IPCHandle()
	require.NoError(t, err)
	// CUDA does not support opening a handle in its exporting process.
	if m, err := ctx.OpenIPCMemHandle(mh, 0); err == nil {
		m.Close()
		t.Log("note: the driver opened an IPC handle in the exporting process")
	} else {
		t.Logf("opening our own handle: %v", err)
	}

	childDev := 0
	if gpuCount(t) > 1 {
		childDev = 1
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(),
		envIPCChild+"=1",
		envIPCMem+"="+mh.String(),
		envIPCEvent+"="+eh.String(),
		envIPCDevice+"="+strconv.Itoa(childDev),
		envIPCSize+"="+strconv.Itoa(n),
	)
	pipe, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = cmd.Stdout
	require.NoError(t, cmd.Start())
	lines := make(chan string, 100)
	var out strings.Builder
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(pipe)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	timeout := time.After(60 * time.Second)
	released := false
read:
	for {
		select {
		case line, ok := <-lines:
			if !ok {
				break read
			}
			out.WriteString(line + "\n")
			if line == "IPC-CHILD-WAITING" && !released {
				// The child's stream now waits on our event; hold it a
				// moment, then let our gated memset (and the event) complete.
				time.Sleep(blockedFor)
				w.store(0, 1)
				released = true
			}
		case <-timeout:
			cmd.Process.Kill()
			require.FailNowf(t, "child timed out", "output:\n%s", out.String())
		}
	}
	err = cmd.Wait()
	t.Logf("child on device %d:\n%s", childDev, out.String())
	require.NoError(t, err, "child")
	require.Contains(t, out.String(), "IPC-CHILD-OK", "child did not report success")
	require.NoError(t, s.MemcpyDtoH(host.Addr(), dm.Ptr(), n))
	syncWithin(t, s, 5*time.Second)
	for i, b := range host.Bytes() {
		require.Equalf(t, byte(ipcReply), b, "byte %d after the child wrote %#x", i, ipcReply)
	}
}

// ipcChild is the child side of TestIPC; its exit status is the result.
func ipcChild() int {
	fail := func(format string, args ...any) int {
		fmt.Printf("IPC-CHILD-FAIL: "+format+"\n", args...)
		return 1
	}
	var mh cuda.IPCMemHandle
	var eh cuda.IPCEventHandle
	if err := mh.UnmarshalText([]byte(os.Getenv(envIPCMem))); err != nil {
		return fail("mem handle: %v", err)
	}
	if err := eh.UnmarshalText([]byte(os.Getenv(envIPCEvent))); err != nil {
		return fail("event handle: %v", err)
	}
	devN, _ := strconv.Atoi(os.Getenv(envIPCDevice))
	n, _ := strconv.Atoi(os.Getenv(envIPCSize))
	if err := cuda.Load(); err != nil {
		return fail("load: %v", err)
	}
	dev, err := cuda.GetDevice(devN)
	if err != nil {
		return fail("device %d: %v", devN, err)
	}
	ctx, err := dev.RetainPrimaryContext()
	if err != nil {
		return fail("context: %v", err)
	}
	defer ctx.Close()
	m, err := ctx.OpenIPCMemHandle(mh, cuda.IPCLazyEnablePeerAccess)
	if err != nil {
		return fail("open mem handle: %v", err)
	}
	defer m.Close()
	ev, err := ctx.OpenIPCEventHandle(eh)
	if err != nil {
		return fail("open event handle: %v", err)
	}
	defer ev.Close()
	s, err := ctx.NewStream(cuda.StreamNonBlocking, 0)
	if err != nil {
		return fail("stream: %v", err)
	}
	defer s.Close()
	host, err := ctx.MemHostAlloc(n, 0)
	if err != nil {
		return fail("host memory: %v", err)
	}
	defer host.Close()
	if err := s.WaitEvent(ev); err != nil {
		return fail("wait event: %v", err)
	}
	if err := s.MemcpyDtoH(host.Addr(), m.Ptr(), n); err != nil {
		return fail("copy: %v", err)
	}
	fmt.Println("IPC-CHILD-WAITING")
	if err := s.Synchronize(); err != nil {
		return fail("synchronize: %v", err)
	}
	for i, b := range host.Bytes() {
		if b != ipcFill {
			return fail("byte %d = %#x, want %#x (did the wait on the parent's event hold?)", i, b, ipcFill)
		}
	}
	if err := s.MemsetD8(m.Ptr(), ipcReply, n); err != nil {
		return fail("memset: %v", err)
	}
	if err := s.Synchronize(); err != nil {
		return fail("synchronize: %v", err)
	}
	if err := m.Close(); err != nil {
		return fail("close mapping: %v", err)
	}
	if err := m.Close(); err == nil {
		return fail("second close of the mapping succeeded")
	}
	fmt.Println("IPC-CHILD-OK")
	return 0
}
