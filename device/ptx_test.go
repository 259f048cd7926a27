package device

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestEmbeddedPTX(t *testing.T) {
	for _, c := range []struct {
		name    string
		ptx     []byte
		kernels []string
	}{
		{"test_kernels", TestKernelsPTX(), []string{KernelEcho, KernelHandle, KernelPingPong, KernelChecksum, KernelFill, KernelPready, KernelParrived, KernelTick, KernelFillAt}},
		{"signal_kernels", SignalKernelsPTX(), []string{KernelSignalWriteWait, KernelSignalWait, KernelSignalWaitStamped}},
	} {
		if !assert.False(t, IsPlaceholder(c.ptx), "%s.ptx holds no kernel: regenerate it with scripts/ptx.sh", c.name) {
			continue
		}
		ptx := string(c.ptx)
		for _, k := range c.kernels {
			assert.Contains(t, ptx, ".entry "+k+"(", "%s.ptx lacks kernel %s: regenerate it with scripts/ptx.sh", c.name, k)
		}
		assert.Contains(t, ptx, ".target sm_75", "%s.ptx does not target sm_75 (compute_75)", c.name)
	}
}

func TestSignalHeader(t *testing.T) {
	h := string(SignalHeader())
	for _, fn := range []string{"ucpx_trigger(", "ucpx_test(", "ucpx_wait(", "typedef struct ucpx_device_handle",
		"typedef struct ucpx_partition_handle", "ucpx_pready(", "ucpx_pready_block(", "ucpx_pstatus(", "ucpx_parrived(",
		"ucpx_parrived_wait(", "ucpx_parrived_wait_block("} {
		assert.Contains(t, h, fn, "ucpx_signal.cuh lacks %s", fn)
	}
}

func TestHandleLayout(t *testing.T) {
	var h Handle
	const mirror = "device.Handle no longer mirrors struct ucpx_device_handle"
	require.EqualValues(t, 32, unsafe.Sizeof(h), mirror)
	require.EqualValues(t, 16, unsafe.Offsetof(h.Completion), mirror)
	require.EqualValues(t, 24, unsafe.Offsetof(h.CompletionValue), mirror)
}

// The Go mirror and the C struct list the same fields in the same order, and the
// status constants agree with the header's.
func TestPartitionHandleLayout(t *testing.T) {
	var h PartitionHandle
	const mirror = "device.PartitionHandle no longer mirrors struct ucpx_partition_handle"
	require.EqualValues(t, 88, unsafe.Sizeof(h), mirror)
	hdr := string(SignalHeader())
	start := strings.Index(hdr, "typedef struct ucpx_partition_handle {")
	require.GreaterOrEqual(t, start, 0)
	end := strings.Index(hdr[start:], "} ucpx_partition_handle;")
	require.Greater(t, end, 0)
	var cFields []string
	for _, line := range strings.Split(hdr[start:start+end], "\n")[1:] {
		line = strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(line), ";"))
		if line == "" {
			continue
		}
		f := strings.Fields(line)
		cFields = append(cFields, strings.TrimLeft(f[len(f)-1], "*"))
	}
	ty := reflect.TypeOf(h)
	require.Equal(t, ty.NumField(), len(cFields), mirror)
	for i, c := range cFields {
		f := ty.Field(i)
		require.Equal(t, strings.ReplaceAll(c, "_", ""), strings.ToLower(f.Name), mirror)
		require.EqualValues(t, 8*i, f.Offset, mirror)
		require.EqualValues(t, 8, f.Type.Size(), mirror)
	}
	// The compiled kernels take the struct by value with the mirror's size.
	ptx := string(TestKernelsPTX())
	for _, k := range []string{KernelPready, KernelParrived} {
		require.Contains(t, ptx, k+"_param_0[88]", "%s's handle parameter is not 88 bytes", k)
	}
	for name, v := range map[string]int64{"UCPX_PART_PENDING": PartPending, "UCPX_PART_DONE": PartDone, "UCPX_PART_FAILED": PartFailed} {
		require.Contains(t, hdr, fmt.Sprintf("#define %s %d ", name, v), "%s differs from the Go constant", name)
	}
}

func TestPattern(t *testing.T) {
	// Spot values of (i*2654435761 + seed) >> 7, truncated to a byte.
	cases := []struct {
		i    uint64
		seed uint32
		want byte
	}{{0, 0, 0}, {1, 0, (2654435761 >> 7) & 0xff}, {3, 7, ((3*2654435761 + 7) >> 7) & 0xff}}
	for _, c := range cases {
		assert.Equal(t, c.want, Pattern(c.i, c.seed), "Pattern(%d, %d)", c.i, c.seed)
	}
}
