/*
 * Stream-side signal kernels of ucpx's CUDA streams. A Stream condition's
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
