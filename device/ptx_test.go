package device

import (
	"bytes"
	"strings"
	"testing"
	"unsafe"
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
		if IsPlaceholder(c.ptx) {
			t.Errorf("%s.ptx holds no kernel: regenerate it with scripts/ptx.sh", c.name)
			continue
		}
		for _, k := range c.kernels {
			if !bytes.Contains(c.ptx, []byte(".entry "+k+"(")) {
				t.Errorf("%s.ptx lacks kernel %s: regenerate it with scripts/ptx.sh", c.name, k)
			}
		}
		if !bytes.Contains(c.ptx, []byte(".target sm_75")) {
			t.Errorf("%s.ptx does not target sm_75 (compute_75)", c.name)
		}
	}
}

func TestSignalHeader(t *testing.T) {
	h := string(SignalHeader())
	for _, fn := range []string{"ucpx_trigger(", "ucpx_test(", "ucpx_wait(", "typedef struct ucpx_device_handle"} {
		if !strings.Contains(h, fn) {
			t.Errorf("ucpx_signal.cuh lacks %s", fn)
		}
	}
}

func TestHandleLayout(t *testing.T) {
	var h Handle
	if unsafe.Sizeof(h) != 32 || unsafe.Offsetof(h.Completion) != 16 || unsafe.Offsetof(h.CompletionValue) != 24 {
		t.Fatal("device.Handle no longer mirrors struct ucpx_device_handle")
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
		if got := Pattern(c.i, c.seed); got != c.want {
			t.Errorf("Pattern(%d, %d) = %#x, want %#x", c.i, c.seed, got, c.want)
		}
	}
}
