/*
 * Stream-side kernels of ucpx's CUDA streams: the signal kernels and the copy
 * kernel of the same-device IPC path. A Stream condition's
 * trigger and completion wait are enqueued as one of these one-thread kernels
 * instead of stream memory operations: a kernel polls the host-mapped
 * completion word in a tight acquire loop, while a memop wait is polled by the
 * GPU's front end, which wakes later (see docs/performance.md, "stream signal
 * kernels"). scripts/ptx.sh compiles this file to device/ptx/signal_kernels.ptx.
 */
#include "ucpx_signal.cuh"

/* Store value into *trigger (release, system scope), then wait until
 * *completion has reached completion_value. Launch with one thread. */
extern "C" __global__ void ucpx_signal_write_wait(uint64_t *trigger, uint64_t value, const uint64_t *completion, uint64_t completion_value)
{
	if (threadIdx.x != 0 || blockIdx.x != 0)
		return;
	__threadfence_system();
	ucpx_word_store_release(trigger, value);
	ucpx_word_wait_geq(completion, completion_value);
}

/* Wait until *completion has reached completion_value. Launch with one thread. */
extern "C" __global__ void ucpx_signal_wait(const uint64_t *completion, uint64_t completion_value)
{
	if (threadIdx.x != 0 || blockIdx.x != 0)
		return;
	ucpx_word_wait_geq(completion, completion_value);
}

/* ucpx_signal_wait that also stamps the GPU's %globaltimer (nanoseconds) into
 * stamps[0] when the stream reaches the wait and into stamps[1] once completion has
 * reached completion_value: the device-side track of ucpx's trace. stamps[1] is
 * stored last, with release semantics, so a host that sees it sees stamps[0] too.
 * Launch with one thread. */
extern "C" __global__ void ucpx_signal_wait_stamped(const uint64_t *completion, uint64_t completion_value, uint64_t *stamps)
{
	if (threadIdx.x != 0 || blockIdx.x != 0)
		return;
	*(volatile uint64_t *)stamps = ucpx_globaltimer();
	ucpx_word_wait_geq(completion, completion_value);
	ucpx_word_store_release(stamps + 1, ucpx_globaltimer());
}

/* Store *src's value into *dst (acquire load, release store, system scope): a
 * word copied in stream order, where cuMemcpyAsync between two host words would
 * block the enqueuing thread. Launch with one thread. */
extern "C" __global__ void ucpx_signal_copy_word(const uint64_t *src, uint64_t *dst)
{
	if (threadIdx.x != 0 || blockIdx.x != 0)
		return;
	ucpx_word_store_release(dst, ucpx_word_load_acquire(src));
}

/* 16 bytes moved by one vector load and one vector store. */
#ifdef __NVCC__
typedef uint4 ucpx_bytes16;
#else
typedef unsigned int ucpx_bytes16 __attribute__((ext_vector_type(4)));
#endif

/* Copy n bytes from src to dst, both memory of this GPU (its own or a same-device
 * peer process's mapping): the same-host device path's copy where a launch costs the
 * CPU less than a copy-engine copy and the SMs copy faster (stream's CopyDevice).
 * dst and src must have the same address modulo 16; any grid, blocks of at least 16
 * threads. */
extern "C" __global__ void ucpx_copy(uint8_t *__restrict__ dst, const uint8_t *__restrict__ src, uint64_t n)
{
	uint64_t tid = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x;
	uint64_t step = (uint64_t)gridDim.x * blockDim.x;
	uint64_t head = (16 - ((uintptr_t)dst & 15)) & 15;
	if (head > n)
		head = n;
	if (tid < head)
		dst[tid] = src[tid];
	uint64_t n16 = (n - head) / 16;
	ucpx_bytes16 *d = (ucpx_bytes16 *)(dst + head);
	const ucpx_bytes16 *s = (const ucpx_bytes16 *)(src + head);
	uint64_t i = tid;
	for (; i + 3 * step < n16; i += 4 * step) {
		ucpx_bytes16 a = s[i], b = s[i + step], c = s[i + 2 * step], e = s[i + 3 * step];
		d[i] = a;
		d[i + step] = b;
		d[i + 2 * step] = c;
		d[i + 3 * step] = e;
	}
	for (; i < n16; i += step)
		d[i] = s[i];
	uint64_t done = head + n16 * 16;
	if (tid < n - done)
		dst[done + tid] = src[done + tid];
}
