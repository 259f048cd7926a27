/*
 * Kernels for ucpx's GPU tests and benchmarks. scripts/ptx.sh compiles this
 * file to device/ptx/test_kernels.ptx (compute_75, so the driver can JIT it
 * for any newer GPU); the PTX is committed and embedded by package device.
 * Names are extern "C" so the PTX entry names are the plain names below.
 */
#include "ucpx_signal.cuh"

static __device__ __forceinline__ uint64_t ucpx_globaltimer(void)
{
	uint64_t t;
	asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
	return t;
}

/*
 * Trigger-and-wait echo: for k = 1..n, store base+k into *trigger, then wait
 * until *done has reached base+k. A host thread that copies *trigger into
 * *done makes each iteration one GPU->host->GPU round trip. One thread works;
 * launch with one block of one thread (others return at once).
 * result[0] = iterations completed, result[1] = elapsed ns (%globaltimer).
 */
extern "C" __global__ void ucpx_test_echo(uint64_t *trigger, uint64_t *done, uint64_t base, uint64_t n, uint64_t *result)
{
	if (threadIdx.x != 0 || blockIdx.x != 0)
		return;
	uint64_t t0 = ucpx_globaltimer();
	uint64_t k;
	for (k = 1; k <= n; k++) {
		ucpx_word_store_release(trigger, base + k);
		ucpx_word_wait_geq(done, base + k);
	}
	uint64_t t1 = ucpx_globaltimer();
	result[0] = k - 1;
	result[1] = t1 - t0;
	__threadfence_system();
}

/*
 * The device-handle path: result[0] = ucpx_test(h) before triggering (0 while
 * the host has not completed), then ucpx_trigger(h), ucpx_wait(h), and
 * result[1] = the completion word's value seen after the wait.
 */
extern "C" __global__ void ucpx_test_handle(ucpx_device_handle h, uint64_t *result)
{
	if (threadIdx.x != 0 || blockIdx.x != 0)
		return;
	result[0] = ucpx_test(h) ? 1 : 0;
	ucpx_trigger(h);
	ucpx_wait(h);
	result[1] = ucpx_word_load_acquire(h.completion);
	__threadfence_system();
}

/*
 * Persistent ping-pong through a device handle: for k = 0..n-1, trigger with
 * h.value + k*step and wait until the completion word reaches
 * h.completion_value + k*step. The host arms step operations per iteration
 * (a receive and a send: step 2) while the kernel runs; one launch replaces a
 * launch per iteration. One thread works, as in ucpx_test_echo.
 * result[0] = iterations completed, result[1] = elapsed ns (%globaltimer).
 */
extern "C" __global__ void ucpx_test_pingpong(ucpx_device_handle h, uint64_t n, uint64_t step, uint64_t *result)
{
	if (threadIdx.x != 0 || blockIdx.x != 0)
		return;
	uint64_t t0 = ucpx_globaltimer();
	uint64_t k;
	for (k = 0; k < n; k++) {
		ucpx_device_handle it = h;
		it.value = h.value + k * step;
		it.completion_value = h.completion_value + k * step;
		ucpx_trigger(it);
		ucpx_wait(it);
	}
	uint64_t t1 = ucpx_globaltimer();
	result[0] = k;
	result[1] = t1 - t0;
	__threadfence_system();
}

/* Sum of the n bytes at buf, added into *out (device memory). Any geometry. */
extern "C" __global__ void ucpx_test_checksum(const uint8_t *buf, uint64_t n, unsigned long long *out)
{
	unsigned long long sum = 0;
	uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
	for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
		sum += buf[i];
	atomicAdd(out, sum);
}

/* buf[i] = (uint8_t)((i * 2654435761 + seed) >> 7), a pattern that depends on
 * index and seed (device.Pattern computes the same on the host). Any geometry. */
extern "C" __global__ void ucpx_test_fill(uint8_t *buf, uint64_t n, uint32_t seed)
{
	uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
	for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
		buf[i] = (uint8_t)((i * 2654435761ull + seed) >> 7);
}
