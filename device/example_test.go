package device_test

import (
	"fmt"

	"github.com/ucpx/ucpx/device"
)

// The committed PTX holds the test kernels; a GPU test loads it with the driver's JIT.
func ExampleTestKernelsPTX() {
	ptx := device.TestKernelsPTX()
	fmt.Println("placeholder:", device.IsPlaceholder(ptx))
	fmt.Println("pattern byte 0, seed 1:", device.Pattern(0, 1))
	// Output:
	// placeholder: false
	// pattern byte 0, seed 1: 0
}
