// Package device holds ucpx's GPU-side code: ucpx_signal.cuh, the header
// kernels include to trigger, test and wait on signal words and to make prepared
// partitions ready and see them arrive (ucpx_pready, ucpx_parrived); the PTX of the
// stream signal kernels (signal_kernels.cu), which CUDA streams use for
// conditions; and the PTX of the test kernels (test_kernels.cu). scripts/ptx.sh
// generates the PTX, embedded here so nothing needs more than the driver
// (which JIT-compiles it).
package device
