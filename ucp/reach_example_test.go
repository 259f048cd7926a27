package ucp_test

import (
	"fmt"

	"github.com/ucpx/ucpx/ucp"
)

// Two processes (here: two contexts) that name the CUDA device their buffers live on
// learn each other's at wire-up; Reach says whether CUDA IPC can move device buffers
// between them.
func ExampleEndpoint_Reach() {
	gpu := [16]byte{0x6b, 0x28, 0xdf, 0x19} // cuDeviceGetUuid of the device in use
	a, err := ucp.NewContext(ucp.ContextParams{DeviceUUID: gpu})
	if err != nil {
		panic(err)
	}
	defer a.Close()
	b, _ := ucp.NewContext(ucp.ContextParams{DeviceUUID: gpu})
	defer b.Close()
	wa, _ := a.NewWorker(ucp.WorkerParams{})
	defer wa.Close()
	wb, _ := b.NewWorker(ucp.WorkerParams{})
	defer wb.Close()
	addr, _ := wb.Address()
	ep, err := wa.ConnectAddress(addr, &ucp.EndpointParams{NoPeerErrorHandling: true})
	if err != nil {
		panic(err)
	}
	r := ep.Reach(nil)
	fmt.Println(r, r.IPC())
	// Output: this host, the same device true
}
