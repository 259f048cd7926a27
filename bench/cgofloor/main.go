// Command cgofloor is a c-shared library with one export that does nothing:
// bench/capi-pingpong.sh times a C loop calling it, the cost of entering Go from C at
// all, against which the C ABI's overhead on the latency path is read.
package main

import "C"

//export ucpx_bench_noop
func ucpx_bench_noop(x C.int) C.int { return x + 1 }

func main() {}
