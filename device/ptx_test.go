package device

import (
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
		{"test_kernels", TestKernelsPTX(), []string{KernelEcho, KernelHandle, KernelPingPong, KernelChecksum, KernelFill}},
		{"signal_kernels", SignalKernelsPTX(), []string{KernelSignalWriteWait, KernelSignalWait}},
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
	for _, fn := range []string{"ucpx_trigger(", "ucpx_test(", "ucpx_wait(", "typedef struct ucpx_device_handle"} {
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
