package ucp

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Every bit of RequestParam.Flags that is not an operation flag ucpx knows, and every
// memory type outside UCX's enumeration, is refused at the call by every nbx operation: the low bits of ucp_op_attr_t name request
// parameter fields (a request to use, a datatype, a reply buffer), and passed on, UCX
// read them from memory nobody filled (a request at a garbage address: SIGSEGV). The
// known flags still work, and the pair still carries a message afterwards.
func TestUnknownOpFlagsRefused(t *testing.T) {
	p := shmPairWith(t, WorkerParams{})
	tg := newTarget(t, p, hostBackend(t), 64, 1)
	buf := make([]byte, 8)
	calls := map[string]func(*RequestParam) (*Request, error){
		"tag_send_nbx": func(rp *RequestParam) (*Request, error) { return p.epA.TagSendNbx(buf, 1, rp) },
		"tag_recv_nbx": func(rp *RequestParam) (*Request, error) { return p.b.TagRecvNbx(buf, 1, MaxTag, rp) },
		"put_nbx": func(rp *RequestParam) (*Request, error) {
			return p.epA.PutNbx(buf, uint64(tg.data.Address()), tg.dataKey, rp)
		},
		"get_nbx": func(rp *RequestParam) (*Request, error) {
			return p.epA.GetNbx(buf, uint64(tg.data.Address()), tg.dataKey, rp)
		},
		"atomic_nbx": func(rp *RequestParam) (*Request, error) {
			return p.epA.AtomicNbx(AtomicParam{Op: AtomicAdd, Operand: 1}, tg.sigs.Addr(0), tg.sigKey, rp)
		},
		"am_send_nbx":      func(rp *RequestParam) (*Request, error) { return p.epA.AmSendNbx(7, nil, buf, rp) },
		"ep_flush_nbx":     func(rp *RequestParam) (*Request, error) { return p.epA.FlushNbx(rp) },
		"worker_flush_nbx": func(rp *RequestParam) (*Request, error) { return p.a.FlushNbx(rp) },
		"put_signal_nbx": func(rp *RequestParam) (*Request, error) {
			return p.epA.PutSignalNbx(buf, uint64(tg.data.Address()), tg.dataKey, Signal{Op: SignalAdd, Value: 1, Addr: tg.sigs.Addr(0), Rkey: tg.sigKey}, rp)
		},
	}
	for name, call := range calls {
		for bit := 0; bit < 31; bit++ {
			f := OpFlags(1) << bit
			if f&knownOpFlags != 0 {
				continue
			}
			_, err := call(&RequestParam{Flags: f})
			require.ErrorIs(t, err, ErrInvalidParam, "%s with flag bit %d", name, bit)
		}
		// A memory type outside UCX's enumeration is bad input too, not "unsupported".
		for _, mt := range []MemoryType{-7, MemoryUnknown - 1, MemoryROCmManaged + 1, 1 << 20} {
			_, err := call(&RequestParam{MemoryType: mt})
			require.ErrorIs(t, err, ErrInvalidParam, "%s with memory type %d", name, mt)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	got := make([]byte, 8)
	rr, err := p.b.TagRecvNbx(got, 2, MaxTag, &RequestParam{Flags: NoImmediateCompletion})
	require.NoError(t, err)
	sr, err := p.epA.TagSendNbx([]byte("8 bytes!"), 2, &RequestParam{Flags: NoImmediateCompletion | FastCompletion})
	require.NoError(t, err)
	recvDone := make(chan error, 1)
	go func() { recvDone <- rr.Wait(ctx) }() // the send may need the receiver's progress
	require.NoError(t, sr.Wait(ctx))
	require.NoError(t, <-recvDone)
	require.Equal(t, []byte("8 bytes!"), got)
}

// MemMapPtr: a memory type outside UCX's enumeration is bad input, and one UCX has no
// transport for here (ROCm, CUDA without ContextParams.Device) is unsupported; before,
// both registered host memory under that type. Host and unknown still register.
func TestMemMapPtrMemoryTypes(t *testing.T) {
	c, err := NewContext(ContextParams{})
	require.NoError(t, err)
	defer c.Close()
	buf, err := c.MemAlloc(4096)
	require.NoError(t, err)
	defer buf.Close()
	for _, mt := range []MemoryType{-7, MemoryUnknown - 1, MemoryROCmManaged + 1, 99} {
		_, err := c.MemMapPtr(buf.Address(), 4096, mt)
		require.ErrorIs(t, err, ErrInvalidParam, "memory type %d", mt)
	}
	for _, mt := range []MemoryType{MemoryCUDA, MemoryCUDAManaged, MemoryROCm, MemoryROCmManaged} {
		if c.SupportsMemoryType(mt) {
			continue
		}
		_, err := c.MemMapPtr(buf.Address(), 4096, mt)
		require.ErrorIs(t, err, ErrUnsupported, "%s", mt)
	}
	for _, mt := range []MemoryType{MemoryHost, MemoryUnknown} {
		m, err := c.MemMapPtr(buf.Address(), 4096, mt)
		require.NoError(t, err, "%s", mt)
		require.NoError(t, m.Close())
	}
}
