/*
 * Kernels for ucpx's GPU tests and benchmarks. scripts/ptx.sh compiles this
 * file to device/ptx/test_kernels.ptx (compute_75, so the driver can JIT it
 * for any newer GPU); the PTX is committed and embedded by package device.
 * Names are extern "C" so the PTX entry names are the plain names below.
 */
#include "ucpx_signal.cuh"

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
 * Two handles of one kernel-triggered condition triggered newest first (two
 * kernels finishing in either order): ucpx_trigger(newer), then
 * ucpx_trigger(older). The trigger word must stay at newer.value, so the
 * newer handle's operations start. result[0] = the trigger word after both,
 * result[1] = the trigger word after the newer one alone. One thread works.
 */
extern "C" __global__ void ucpx_test_trigger_newest_first(ucpx_device_handle newer, ucpx_device_handle older, uint64_t *result)
{
	if (threadIdx.x != 0 || blockIdx.x != 0)
		return;
	ucpx_trigger(newer);
	result[1] = ucpx_word_load_acquire(newer.trigger);
	ucpx_trigger(older);
	result[0] = ucpx_word_load_acquire(newer.trigger);
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

/* The byte ucpx_test_fill writes at index i for seed. */
static __device__ __forceinline__ uint8_t ucpx_test_pattern(uint64_t i, uint32_t seed)
{
	return (uint8_t)((i * 2654435761ull + seed) >> 7);
}

/*
 * Producer of a prepared partitioned send (prepare.Request.DeviceHandle): block
 * b handles partition p = b, or p = gridDim.x-1-b with reverse set. The block
 * writes the ucpx_test_fill pattern for seed into the partition's bytes of buf
 * (indices counted from the start of buf), then makes the partition ready with
 * ucpx_pready_block. *failures counts the partitions ucpx_pready reported
 * failed (the peer died). Launch h.partitions blocks of any width.
 */
extern "C" __global__ void ucpx_test_pready(ucpx_partition_handle h, uint8_t *buf, uint32_t seed, uint32_t reverse, unsigned long long *failures)
{
	uint64_t p = reverse ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
	if (p >= h.partitions)
		return;
	uint64_t base = p * h.part_bytes;
	for (uint64_t i = threadIdx.x; i < h.part_bytes; i += blockDim.x)
		buf[base + i] = ucpx_test_pattern(base + i, seed);
	bool ok = ucpx_pready_block(h, p);
	if (!ok && threadIdx.x == 0) {
		atomicAdd(failures, 1ull);
		__threadfence_system();
	}
}

/*
 * Consumer of a prepared partitioned receive: block q records ucpx_pstatus of
 * partition q before waiting (status[2q], as an int64: UCPX_PART_PENDING while
 * the sender has not moved it), waits with ucpx_parrived_wait_block, then sums
 * the partition's bytes of buf into sums[q] and stores status[2q+1] = 1 (or 2
 * if the peer failed, sums[q] then 0). Launch h.partitions blocks of any
 * width (at most 1024 threads).
 */
extern "C" __global__ void ucpx_test_parrived(ucpx_partition_handle h, const uint8_t *buf, unsigned long long *sums, uint64_t *status)
{
	__shared__ unsigned long long block_sum;
	uint64_t q = blockIdx.x;
	if (q >= h.partitions)
		return;
	bool leader = threadIdx.x == 0;
	if (leader) {
		block_sum = 0;
		status[2 * q] = (uint64_t)(int64_t)ucpx_pstatus(h, q);
	}
	if (!ucpx_parrived_wait_block(h, q)) {
		if (leader) {
			sums[q] = 0;
			status[2 * q + 1] = 2;
			__threadfence_system();
		}
		return;
	}
	uint64_t base = q * h.part_bytes;
	unsigned long long s = 0;
	for (uint64_t i = threadIdx.x; i < h.part_bytes; i += blockDim.x)
		s += buf[base + i];
	atomicAdd(&block_sum, s);
	__syncthreads();
	if (leader) {
		sums[q] = block_sum;
		status[2 * q + 1] = 1;
		__threadfence_system();
	}
}

/* (*w)++, one thread: counts the launches of a graph (ucpx_test_fill_at reads it). */
extern "C" __global__ void ucpx_test_tick(uint64_t *w)
{
	if (threadIdx.x != 0 || blockIdx.x != 0)
		return;
	volatile uint64_t *v = w;
	*v = *v + 1;
	__threadfence_system();
}

/* buf[i] = the ucpx_test_fill pattern at index offset+i for seed *seed_word
 * (truncated to 32 bits), for i < n: one partition of a buffer whose seed a
 * ucpx_test_tick node earlier in the graph advanced. Any geometry. */
extern "C" __global__ void ucpx_test_fill_at(uint8_t *buf, uint64_t n, uint64_t offset, const uint64_t *seed_word)
{
	uint32_t seed = (uint32_t)*(const volatile uint64_t *)seed_word;
	uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
	for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
		buf[i] = ucpx_test_pattern(offset + i, seed);
}

/* ucpx_test_status: trigger h, wait for its completion, then report the status
 * word: result[0] = ucpx_status(h), result[1] = the completion word. A consumer
 * kernel skips its data when result[0] != 0. */
extern "C" __global__ void ucpx_test_status(ucpx_device_handle h, uint64_t *result)
{
	if (threadIdx.x != 0 || blockIdx.x != 0)
		return;
	ucpx_trigger(h);
	ucpx_wait(h);
	result[0] = ucpx_status(h);
	result[1] = ucpx_word_load_acquire(h.completion);
	__threadfence_system();
}

/*
 * One side of a prepared-partition ping-pong between kernels, one partition of
 * sh (send) and rh (receive) each way, one block. The initiator writes out
 * (the ucpx_test_fill pattern for seed), readies it and waits for its reply;
 * the responder waits first, then writes and readies its reply. Each sums the
 * partition it received into sums[0]. The initiator stores %globaltimer right
 * before ucpx_pready and right after ucpx_parrived_wait into stamps[0..1]: one
 * round trip between the two kernels, with no launch inside it; the responder
 * stores its own two (after ucpx_parrived_wait, before ucpx_pready) into
 * stamps[2..3], so the two directions can be told apart (one GPU: one timer).
 * *failures counts refused calls (a failed peer).
 */
extern "C" __global__ void ucpx_test_part_pingpong(ucpx_partition_handle sh, ucpx_partition_handle rh, uint8_t *out,
						    const uint8_t *in, uint32_t seed, uint32_t initiator,
						    unsigned long long *sums, uint64_t *stamps,
						    unsigned long long *failures)
{
	__shared__ unsigned long long block_sum;
	bool leader = threadIdx.x == 0;
	bool ok = true;
	if (leader)
		block_sum = 0;
	uint64_t arrived = 0;
	if (!initiator) {
		ok = ucpx_parrived_wait_block(rh, 0);
		arrived = ucpx_globaltimer();
	}
	for (uint64_t i = threadIdx.x; i < sh.part_bytes; i += blockDim.x)
		out[i] = ucpx_test_pattern(i, seed);
	uint64_t t0 = ucpx_globaltimer();
	ok = ucpx_pready_block(sh, 0) && ok;
	if (initiator)
		ok = ucpx_parrived_wait_block(rh, 0) && ok;
	uint64_t t1 = ucpx_globaltimer();
	unsigned long long s = 0;
	for (uint64_t i = threadIdx.x; i < rh.part_bytes; i += blockDim.x)
		s += in[i];
	atomicAdd(&block_sum, s);
	__syncthreads();
	if (leader) {
		sums[0] = block_sum;
		if (initiator) {
			stamps[0] = t0;
			stamps[1] = t1;
		} else {
			stamps[2] = arrived;
			stamps[3] = t0;
		}
		if (!ok)
			atomicAdd(failures, 1ull);
		__threadfence_system();
	}
}

/* Kernel-initiated put with signal: block b copies chunk bytes at src + b*chunk
 * into dst + b*chunk (a peer's mapped buffer) and sets flags[b] (the peer's
 * mapped words) to value; warp variant for odd b (one warp of the block copies),
 * block variant for even b. */
extern "C" __global__ void ucpx_test_put_signal(uint8_t *dst, const uint8_t *src, uint64_t chunk, uint64_t *flags, uint64_t value)
{
	uint64_t b = blockIdx.x;
	if (b & 1) {
		if (threadIdx.x < 32)
			ucpx_put_signal_warp(dst + b * chunk, src + b * chunk, chunk, flags + b, value);
	} else {
		ucpx_put_signal_block(dst + b * chunk, src + b * chunk, chunk, flags + b, value);
	}
}

/* The receiving kernel: block b waits until flags[b] reaches value (acquire),
 * then adds the bytes of its chunk of buf to *sum. */
extern "C" __global__ void ucpx_test_wait_flags(const uint64_t *flags, uint64_t value, const uint8_t *buf, uint64_t chunk, unsigned long long *sum)
{
	if (threadIdx.x == 0)
		ucpx_word_wait_geq(flags + blockIdx.x, value);
	__syncthreads();
	unsigned long long s = 0;
	for (uint64_t i = threadIdx.x; i < chunk; i += blockDim.x)
		s += buf[blockIdx.x * chunk + i];
	atomicAdd(sum, s);
}
