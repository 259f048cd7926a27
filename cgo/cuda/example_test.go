package cuda_test

import (
	"errors"
	"fmt"
	"log"
	"sync/atomic"
	"unsafe"

	"github.com/ucpx/ucpx/cgo/cuda"
)

// Load is explicit and cheap to call again. Where there is no driver the error
// matches ErrNoDriver and the program carries on with host-only features.
func ExampleLoad() {
	err := cuda.Load()
	switch {
	case err == nil:
		n, _ := cuda.DeviceCount()
		_ = n // use the GPUs
	case errors.Is(err, cuda.ErrNoDriver):
		// No usable CUDA driver here: fall back to host streams.
	default:
		log.Fatal(err) // not reached: every Load error matches ErrNoDriver
	}
	fmt.Println("host features work either way")
	// Output: host features work either way
}

// Bad arguments are refused before any driver call, with errors that match
// the CUDA sentinels.
func ExampleMemOp_Validate() {
	op := cuda.WaitValue64Op(0x7f0000001004, 1, cuda.WaitGEQ) // not 8-byte aligned
	err := op.Validate()
	fmt.Println(errors.Is(err, cuda.ErrInvalidValue))
	fmt.Println(cuda.Result(218))
	// Output:
	// true
	// CUDA_ERROR_INVALID_PTX
}

// IPC handles are plain bytes; their text form travels in JSON, flags or
// environment variables.
func ExampleIPCMemHandle() {
	var h cuda.IPCMemHandle
	h[0], h[63] = 0xab, 0x01
	text, _ := h.MarshalText()
	var back cuda.IPCMemHandle
	_ = back.UnmarshalText(text)
	fmt.Println(len(text), back == h)
	// Output: 128 true
}

// A stream-memop round trip: the GPU stream writes a trigger word, a host
// thread answers in a completion word, and the stream waits for it.
func Example_roundTrip() {
	if err := cuda.Load(); err != nil {
		fmt.Println("no CUDA:", errors.Is(err, cuda.ErrNoDriver))
		return
	}
	dev, _ := cuda.GetDevice(0)
	ctx, err := dev.RetainPrimaryContext()
	if err != nil {
		log.Fatal(err)
	}
	defer ctx.Close()
	s, _ := ctx.NewStream(cuda.StreamNonBlocking, 0)
	defer s.Close()
	words, _ := ctx.MemHostAlloc(16, cuda.HostAllocPortable|cuda.HostAllocDeviceMap)
	defer words.Close()
	trigger, done := words.DevicePtr(), words.DevicePtr()+8 // GPU addresses
	hostTrigger := (*uint64)(words.Ptr())                   // CPU addresses
	hostDone := (*uint64)(unsafe.Add(words.Ptr(), 8))

	// The proxy: sees the trigger, does the work, stores the completion.
	go func() {
		for atomic.LoadUint64(hostTrigger) != 1 {
		}
		atomic.StoreUint64(hostDone, 1)
	}()
	_ = s.BatchMemOp([]cuda.MemOp{
		cuda.WriteValue64Op(trigger, 1, cuda.WriteDefault),
		cuda.WaitValue64Op(done, 1, cuda.WaitGEQ),
	})
	_ = s.Synchronize()
}
