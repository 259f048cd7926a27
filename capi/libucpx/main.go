// Command libucpx is ucpx's C ABI: built with -buildmode=c-shared (make libucpx) it is
// libucpx.so, whose calls include/ucpx.h declares and documents. It is a main package
// only because c-shared needs one; main does nothing.
//
// Every exported call takes and returns integers and caller-owned C memory: Go objects
// stay in a handle table (handles.go) and never cross the boundary. Calls may come
// from any C thread; the ucp API they reach is safe for concurrent use, and the table
// has its own lock. Errors become ucpx_status codes, with the message kept per calling
// thread for ucpx_last_error (errors.go).
//
// The preamble includes the hand-written header, so the compiler checks every export
// against its declaration there (cgo's generated prototypes must agree with it).
package main

/*
#cgo CFLAGS: -I${SRCDIR}/../../include -I${SRCDIR}/../../cgo/ucx
#include "ucpx.h"
*/
import "C"

func main() {}
