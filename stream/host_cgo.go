package stream

/*
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

// ucpx_words_alloc returns n zeroed 64-bit words aligned to a cache line (so a block's
// first word does not share a line with unrelated data), or NULL.
static void *ucpx_words_alloc(size_t n) {
	void *p = NULL;
	if (posix_memalign(&p, 64, n * 8) != 0) {
		return NULL;
	}
	memset(p, 0, n * 8);
	return p;
}

// ucpx_copy takes raw addresses as integers so the Go side never converts a uintptr
// to an unsafe.Pointer (which go vet rightly distrusts).
static void ucpx_copy(uintptr_t dst, uintptr_t src, size_t n) {
	memmove((void *)dst, (const void *)src, n);
}
*/
import "C"

import (
	"fmt"
	"unsafe"
)

// cAllocWords allocates n zeroed, 64-byte aligned words in C memory.
func cAllocWords(n int) (unsafe.Pointer, error) {
	p := C.ucpx_words_alloc(C.size_t(n))
	if p == nil {
		return nil, fmt.Errorf("stream: host AllocWords(%d): out of C memory", n)
	}
	return p, nil
}

func cFree(p unsafe.Pointer) { C.free(p) }

// cCopy moves n bytes between raw addresses; the ranges may overlap.
func cCopy(dst, src uintptr, n int) {
	C.ucpx_copy(C.uintptr_t(dst), C.uintptr_t(src), C.size_t(n))
}
