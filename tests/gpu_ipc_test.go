package tests

import (
	"bufio"
	"encoding/hex"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/cgo/cuda"
	"github.com/ucpx/ucpx/internal/testenv"
	"github.com/ucpx/ucpx/protocol"
)

// cudaIPC is protocol.IPCDriver over package cuda (the coordinator moves an adapter
// like it next to the CUDA stream backend when the IPC path is wired).
type cudaIPC struct {
	ctx  *cuda.Context
	mu   sync.Mutex
	maps map[uintptr]*cuda.IPCMapping
}

func newCudaIPC(ctx *cuda.Context) *cudaIPC {
	return &cudaIPC{ctx: ctx, maps: map[uintptr]*cuda.IPCMapping{}}
}

func (d *cudaIPC) IPCAllocation(ptr uintptr) (protocol.IPCAllocation, error) {
	a, err := d.ctx.AllocationOf(ptr)
	return protocol.IPCAllocation{Base: uint64(a.Base), Size: a.Size, BufferID: a.BufferID, LegacyIPC: a.LegacyIPC}, err
}

func (d *cudaIPC) IPCGetMemHandle(base uintptr) (protocol.IPCHandle, error) {
	h, err := d.ctx.IPCMemHandle(base)
	return protocol.IPCHandle(h), err
}

func (d *cudaIPC) IPCOpenMemHandle(h protocol.IPCHandle) (uintptr, error) {
	m, err := d.ctx.OpenIPCMemHandle(cuda.IPCMemHandle(h), cuda.IPCLazyEnablePeerAccess)
	if err != nil {
		return 0, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.maps[m.Ptr()] = m
	return m.Ptr(), nil
}

func (d *cudaIPC) IPCCloseMemHandle(p uintptr) error {
	d.mu.Lock()
	m := d.maps[p]
	delete(d.maps, p)
	d.mu.Unlock()
	if m == nil {
		return fmt.Errorf("no mapping at %#x", p)
	}
	return m.Close()
}

const envIPCCacheChild = "UCPX_TEST_IPC_CACHE_CHILD"

// cuda.Device gives LocalHostIdentity the device's UUID.
var _ protocol.DeviceUUID = cuda.Device{}

// ipcStep is one operation the parent describes to the child: the IPC message it
// carries (if any), the reference, and the checksum of the bytes there.
type ipcStep struct {
	msg []byte
	ref protocol.IPCRef
	n   int
	crc uint32
	// fill: the child overwrites the bytes with this value after checking them.
	fill byte
	// stale: a reference that must no longer resolve.
	stale *protocol.IPCRef
}

func (s ipcStep) line() string {
	msg := "-"
	if s.msg != nil {
		msg = hex.EncodeToString(s.msg)
	}
	stale := "-"
	if s.stale != nil {
		stale = fmt.Sprintf("%d:%d:%d:%d", s.stale.Alloc.Base, s.stale.Alloc.Size, s.stale.Alloc.BufferID, s.stale.Offset)
	}
	return fmt.Sprintf("%s %d %d %d %d %d %d %d %s\n", msg, s.ref.Alloc.Base, s.ref.Alloc.Size, s.ref.Alloc.BufferID, s.ref.Offset, s.n, s.crc, s.fill, stale)
}

// A device buffer exported here is opened in a child process on the same GPU through
// the handle cache: bytes checked both ways, one open per allocation however many
// operations name it, and a buffer freed and reallocated at the same address is
// exported again and mapped afresh (the child never reads the old memory through the
// new reference, and the old reference stops resolving); an invalidation unmaps.
func TestGPUIPCHandleCache(t *testing.T) {
	dev := testenv.RequireGPU(t)
	ctx, err := dev.RetainPrimaryContext()
	require.NoError(t, err)
	defer ctx.Close()
	s, err := ctx.NewStream(cuda.StreamNonBlocking, 0)
	require.NoError(t, err)
	defer s.Close()
	const n = 4 << 20
	host, err := ctx.MemHostAlloc(n, 0)
	require.NoError(t, err)
	defer host.Close()
	fill := func(dst uintptr, seed byte) uint32 {
		b := host.Bytes()
		for i := range b {
			b[i] = byte(i*7) ^ seed
		}
		require.NoError(t, s.MemcpyHtoD(dst, host.Addr(), n))
		require.NoError(t, s.Synchronize())
		return crc32.ChecksumIEEE(b)
	}
	readBack := func(src uintptr) []byte {
		require.NoError(t, s.MemcpyDtoH(host.Addr(), src, n))
		require.NoError(t, s.Synchronize())
		return host.Bytes()
	}

	ex := protocol.NewIPCExporter(newCudaIPC(ctx))
	m1, err := ctx.MemAlloc(n)
	require.NoError(t, err)
	crc1 := fill(m1.Ptr(), 1)

	child := startIPCChild(t)
	// Same-host identity: the child, on the same GPU, is reachable by CUDA IPC.
	local, err := protocol.LocalHostIdentity(dev)
	require.NoError(t, err)
	require.NotEqual(t, [16]byte{}, local.Device, "device UUID")
	peer := child.identity(t)
	require.Equal(t, protocol.ReachSameDevice, protocol.IPCReach(local, peer, nil), "parent %+v child %+v", local, peer)
	export := func(ptr uintptr, size int) (protocol.IPCRef, []byte) {
		ref, msg, err := ex.Export(1, ptr, size)
		require.NoError(t, err)
		if msg == nil {
			return ref, nil
		}
		b, err := msg.AppendBinary(nil)
		require.NoError(t, err)
		return ref, b
	}
	// 1: the first operation carries the handle; the child checks and overwrites.
	ref1, msg := export(m1.Ptr(), n)
	require.NotNil(t, msg)
	child.step(t, ipcStep{msg: msg, ref: ref1, n: n, crc: crc1, fill: 0xc3}, "opens=1 mapped=1")
	for i, b := range readBack(m1.Ptr()) {
		require.Equalf(t, byte(0xc3), b, "byte %d after the child wrote", i)
	}
	// 2: more operations on the same allocation carry no handle and open nothing.
	crc1 = fill(m1.Ptr(), 2)
	for range 3 {
		ref, msg := export(m1.Ptr(), n)
		require.Nil(t, msg)
		child.step(t, ipcStep{ref: ref, n: n, crc: crc1}, "opens=1 mapped=1")
	}
	// 3: free and reallocate (the driver usually returns the same address): a new
	// allocation, exported again; the child drops the stale mapping first.
	base := m1.Ptr()
	require.NoError(t, m1.Close())
	var m2 *cuda.DeviceMemory
	var held []*cuda.DeviceMemory
	for range 16 {
		m, err := ctx.MemAlloc(n)
		require.NoError(t, err)
		if m.Ptr() == base {
			m2 = m
			break
		}
		held = append(held, m)
	}
	if m2 == nil {
		t.Logf("the driver never reallocated %#x: checking a new allocation elsewhere", base)
		m2, held = held[len(held)-1], held[:len(held)-1]
	}
	for _, m := range held {
		require.NoError(t, m.Close())
	}
	defer m2.Close()
	crc2 := fill(m2.Ptr(), 3)
	ref2, msg := export(m2.Ptr(), n)
	require.NotNil(t, msg, "a reallocated buffer is exported again")
	require.NotEqual(t, ref1.Alloc.BufferID, ref2.Alloc.BufferID)
	step := ipcStep{msg: msg, ref: ref2, n: n, crc: crc2, stale: &ref1}
	want := "opens=2 mapped=1"
	if m2.Ptr() != base {
		step.stale, want = nil, "opens=2 mapped=2" // the old mapping is elsewhere, still valid
	}
	child.step(t, step, want)
	// 4: forgetting the allocation tells the child to unmap it.
	peers, inv := ex.Forget(ref2.Alloc)
	require.Equal(t, []protocol.IPCPeer{1}, peers)
	b, err := inv.AppendBinary(nil)
	require.NoError(t, err)
	child.step(t, ipcStep{msg: b, ref: ref2}, "unmapped")
	child.finish(t)
}

type ipcChildProc struct {
	cmd   *exec.Cmd
	in    io.WriteCloser
	lines chan string
	out   strings.Builder
}

func startIPCChild(t *testing.T) *ipcChildProc {
	t.Helper()
	c := &ipcChildProc{lines: make(chan string, 16)}
	c.cmd = exec.Command(os.Args[0], "-test.run=^TestIPCCacheChild$", "-test.v")
	c.cmd.Env = append(os.Environ(), envIPCCacheChild+"=1")
	var err error
	c.in, err = c.cmd.StdinPipe()
	require.NoError(t, err)
	pipe, err := c.cmd.StdoutPipe()
	require.NoError(t, err)
	c.cmd.Stderr = c.cmd.Stdout
	require.NoError(t, c.cmd.Start())
	t.Cleanup(func() { _ = c.cmd.Process.Kill(); _ = c.cmd.Wait() })
	go func() {
		defer close(c.lines)
		sc := bufio.NewScanner(pipe)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
	}()
	return c
}

// identity waits for the child's host identity.
func (c *ipcChildProc) identity(t *testing.T) protocol.HostIdentity {
	t.Helper()
	b, err := hex.DecodeString(c.await(t, "IPC-CACHE-ID "))
	require.NoError(t, err)
	id, err := protocol.DecodeHostIdentity(b)
	require.NoError(t, err)
	return id
}

// step sends one operation and waits for the child's "OK <want>".
func (c *ipcChildProc) step(t *testing.T, s ipcStep, want string) {
	t.Helper()
	_, err := io.WriteString(c.in, s.line())
	require.NoError(t, err)
	require.Equal(t, want, c.await(t, "IPC-CACHE-OK "), "child output:\n%s", c.out.String())
}

// await reads the child's lines until one starting with prefix, and returns the rest of
// it; a failure line, the child's exit or a minute's silence fails the test.
func (c *ipcChildProc) await(t *testing.T, prefix string) string {
	t.Helper()
	timeout := time.After(60 * time.Second)
	for {
		select {
		case line, ok := <-c.lines:
			require.True(t, ok, "child exited:\n%s", c.out.String())
			c.out.WriteString(line + "\n")
			if strings.HasPrefix(line, "IPC-CACHE-FAIL") {
				require.FailNow(t, line, "child output:\n%s", c.out.String())
			}
			if rest, found := strings.CutPrefix(line, prefix); found {
				return rest
			}
		case <-timeout:
			require.FailNow(t, "child timed out", "output:\n%s", c.out.String())
		}
	}
}

func (c *ipcChildProc) finish(t *testing.T) {
	t.Helper()
	require.NoError(t, c.in.Close())
	for line := range c.lines {
		c.out.WriteString(line + "\n")
	}
	require.NoError(t, c.cmd.Wait(), "child:\n%s", c.out.String())
	t.Logf("child:\n%s", c.out.String())
}

// TestIPCCacheChild is the child side of TestGPUIPCHandleCache (it runs only there):
// an importer reading steps from stdin.
func TestIPCCacheChild(t *testing.T) {
	if os.Getenv(envIPCCacheChild) != "1" {
		t.Skip("the child of TestGPUIPCHandleCache")
	}
	fail := func(format string, args ...any) {
		fmt.Printf("IPC-CACHE-FAIL "+format+"\n", args...)
		t.FailNow()
	}
	dev := testenv.RequireGPU(t)
	ctx, err := dev.RetainPrimaryContext()
	require.NoError(t, err)
	defer ctx.Close()
	s, err := ctx.NewStream(cuda.StreamNonBlocking, 0)
	require.NoError(t, err)
	defer s.Close()
	id, err := protocol.LocalHostIdentity(dev)
	if err != nil {
		fail("identity: %v", err)
	}
	idb, _ := id.AppendBinary(nil)
	fmt.Printf("IPC-CACHE-ID %s\n", hex.EncodeToString(idb))
	drv := newCudaIPC(ctx)
	opens := 0
	counting := &countingIPC{cudaIPC: drv, opens: &opens}
	im := protocol.NewIPCImporter(counting)
	defer im.Close()
	var host *cuda.HostMemory
	sc := bufio.NewScanner(os.Stdin)
	sc.Buffer(make([]byte, 1<<16), 1<<16)
	for sc.Scan() {
		var msgHex, stale string
		var st ipcStep
		_, err := fmt.Sscanf(sc.Text(), "%s %d %d %d %d %d %d %d %s", &msgHex, &st.ref.Alloc.Base, &st.ref.Alloc.Size, &st.ref.Alloc.BufferID, &st.ref.Offset, &st.n, &st.crc, &st.fill, &stale)
		if err != nil {
			fail("bad step %q: %v", sc.Text(), err)
		}
		if msgHex != "-" {
			b, err := hex.DecodeString(msgHex)
			if err != nil {
				fail("hex: %v", err)
			}
			m, err := protocol.DecodeIPCMessage(b)
			if err != nil {
				fail("decode: %v", err)
			}
			if err := im.Handle(1, m); err != nil {
				fail("handle: %v", err)
			}
			if m.Kind == protocol.IPCInvalidate {
				if _, err := im.Resolve(1, st.ref, 8); err == nil {
					fail("an invalidated allocation still resolves")
				}
				fmt.Printf("IPC-CACHE-OK unmapped\n")
				continue
			}
		}
		if stale != "-" {
			var old protocol.IPCRef
			if _, err := fmt.Sscanf(stale, "%d:%d:%d:%d", &old.Alloc.Base, &old.Alloc.Size, &old.Alloc.BufferID, &old.Offset); err != nil {
				fail("stale: %v", err)
			}
			if _, err := im.Resolve(1, old, 8); err == nil {
				fail("the freed allocation's reference still resolves")
			}
		}
		p, err := im.Resolve(1, st.ref, st.n)
		if err != nil {
			fail("resolve: %v", err)
		}
		if host == nil {
			if host, err = ctx.MemHostAlloc(st.n, 0); err != nil {
				fail("host memory: %v", err)
			}
			defer host.Close()
		}
		if err := s.MemcpyDtoH(host.Addr(), p, st.n); err != nil {
			fail("copy: %v", err)
		}
		if err := s.Synchronize(); err != nil {
			fail("sync: %v", err)
		}
		if got := crc32.ChecksumIEEE(host.Bytes()[:st.n]); got != st.crc {
			fail("checksum %#x, want %#x (stale mapping?)", got, st.crc)
		}
		if st.fill != 0 {
			if err := s.MemsetD8(p, st.fill, st.n); err != nil {
				fail("memset: %v", err)
			}
			if err := s.Synchronize(); err != nil {
				fail("sync: %v", err)
			}
		}
		fmt.Printf("IPC-CACHE-OK opens=%d mapped=%d\n", opens, im.Mapped())
	}
}

type countingIPC struct {
	*cudaIPC
	opens *int
}

func (c *countingIPC) IPCOpenMemHandle(h protocol.IPCHandle) (uintptr, error) {
	*c.opens++
	return c.cudaIPC.IPCOpenMemHandle(h)
}
