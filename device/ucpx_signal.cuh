/*
 * ucpx_signal.cuh — device side of ucpx signal words.
 *
 * A signal word is a 64-bit counter in host-mapped pinned memory
 * (cuMemHostAlloc(PORTABLE|DEVICEMAP)), so the GPU and ucpx's proxy thread
 * both see it. A kernel starts a communication operation by storing into the
 * operation's trigger word; ucpx performs the operation and stores into its
 * completion word, which the kernel may test or wait on.
 *
 * Include this header in your .cu files; it has no other dependency.
 * Compile for sm_70 or newer to get release/acquire instructions; older
 * targets fall back to volatile accesses with system fences.
 *
 * Call the functions from ONE thread (for example threadIdx.x == 0 of one
 * block). If other threads produced the data being sent, make their writes
 * visible to that thread first (__syncthreads() within a block, a grid-wide
 * barrier across blocks): the fence in ucpx_trigger orders only the calling
 * thread's own writes.
 */
#ifndef UCPX_SIGNAL_CUH
#define UCPX_SIGNAL_CUH

#include <stdint.h>

/*
 * ucpx_device_handle is the POD a kernel receives (by value, as a kernel
 * argument) for a kernel-triggered condition. Four 8-byte members, no
 * padding: 32 bytes, 8-byte aligned. The Go mirror is device.Handle.
 *
 *   trigger           device address of the condition's trigger word
 *   value             value ucpx_trigger stores into *trigger
 *   completion        device address of the completion word (may be NULL when
 *                     the condition reports completion elsewhere)
 *   completion_value  ucpx_test/ucpx_wait succeed once *completion has
 *                     reached this value (wrap-aware: (int64_t)(cur - v) >= 0)
 */
typedef struct ucpx_device_handle {
	uint64_t *trigger;
	uint64_t value;
	uint64_t *completion;
	uint64_t completion_value;
} ucpx_device_handle;

/* Store v into *p with release semantics at system scope: every earlier
 * write of this thread is visible to the CPU (and other GPUs) before v is. */
static __device__ __forceinline__ void ucpx_word_store_release(uint64_t *p, uint64_t v)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
	asm volatile("st.release.sys.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
#else
	__threadfence_system();
	*(volatile uint64_t *)p = v;
#endif
}

/* Load *p with acquire semantics at system scope: reads after it see every
 * write the CPU made before storing the value observed. Never cached: each
 * call reads the word again. */
static __device__ __forceinline__ uint64_t ucpx_word_load_acquire(const uint64_t *p)
{
	uint64_t v;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
	asm volatile("ld.acquire.sys.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
#else
	v = *(const volatile uint64_t *)p;
	__threadfence_system();
#endif
	return v;
}

/* Wrap-aware "cur has reached target", the comparison of CUDA's
 * CU_STREAM_WAIT_VALUE_GEQ on 64-bit words. */
static __device__ __forceinline__ bool ucpx_word_reached(uint64_t cur, uint64_t target)
{
	return (int64_t)(cur - target) >= 0;
}

/* Spin until *p has reached v. Each iteration is one read across the bus
 * (about a microsecond over PCIe), which paces the loop by itself. */
static __device__ __forceinline__ void ucpx_word_wait_geq(const uint64_t *p, uint64_t v)
{
	while (!ucpx_word_reached(ucpx_word_load_acquire(p), v)) {
	}
}

/* Start the operation: make this thread's earlier writes (the data to send)
 * visible system-wide, then store h.value into the trigger word. The fence
 * is what orders the data before the flag on pre-sm_70 targets; on newer ones
 * the release store orders it too and the fence costs little next to the bus. */
static __device__ __forceinline__ void ucpx_trigger(ucpx_device_handle h)
{
	__threadfence_system();
	ucpx_word_store_release(h.trigger, h.value);
}

/* Has the operation completed? Non-blocking; true when there is no
 * completion word. */
static __device__ __forceinline__ bool ucpx_test(ucpx_device_handle h)
{
	if (h.completion == 0)
		return true;
	return ucpx_word_reached(ucpx_word_load_acquire(h.completion), h.completion_value);
}

/* Block until the operation has completed; afterwards the data ucpx
 * delivered before completing is visible to this thread. */
static __device__ __forceinline__ void ucpx_wait(ucpx_device_handle h)
{
	if (h.completion == 0)
		return;
	ucpx_word_wait_geq(h.completion, h.completion_value);
}

#endif /* UCPX_SIGNAL_CUH */
