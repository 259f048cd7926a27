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
 * targets fall back to volatile accesses with system fences. ucpx_trigger
 * needs sm_60 or newer (a system-scope atomic max).
 *
 * Call the functions from ONE thread (for example threadIdx.x == 0 of one
 * block), except the *_block functions of prepared partitions (below), which
 * every thread of a block calls. If other threads produced the data being sent, make their writes
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
 * write of this thread, and of threads that passed a barrier with it before,
 * is visible to the CPU (and other GPUs) before v is. */
static __device__ __forceinline__ void ucpx_word_store_release(uint64_t *p, uint64_t v)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
	asm volatile("st.release.sys.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
#else
	__threadfence_system();
	*(volatile uint64_t *)p = v;
#endif
}

/* The GPU's nanosecond clock (%globaltimer), what trace stamps carry. */
static __device__ __forceinline__ uint64_t ucpx_globaltimer(void)
{
	uint64_t t;
	asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
	return t;
}

/* Store v into *p at system scope with no ordering of its own (a later
 * release store of the same thread orders it). */
static __device__ __forceinline__ void ucpx_word_store_relaxed(uint64_t *p, uint64_t v)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
	asm volatile("st.relaxed.sys.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
#else
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

/* Move *p forward to v at system scope, never back, so that of two triggers
 * stored in either order the newer value stays: an atomic max, relaxed (the caller
 * fences first, as ucpx_trigger does). A reduction: the thread does not wait for
 * its result, where a compare-and-swap waits a bus round trip for each read and
 * swap. Trigger values are sequence numbers from 1 that never wrap. */
static __device__ __forceinline__ void ucpx_word_advance(uint64_t *p, uint64_t v)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
	asm volatile("red.relaxed.sys.max.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
#else
	asm volatile("red.sys.max.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
#endif
}

/* Start the operation: make this thread's earlier writes (the data to send)
 * visible system-wide (the fence orders them before the trigger's relaxed
 * atomic), then move the trigger word forward to h.value. It only moves forward: a handle older than one triggered
 * already (two kernels finishing in either order) changes nothing, where a
 * plain store took the trigger back and the newer handle's operations never
 * started. condition.Trigger is the host twin. */
static __device__ __forceinline__ void ucpx_trigger(ucpx_device_handle h)
{
	__threadfence_system();
	ucpx_word_advance(h.trigger, h.value);
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

/* The failure status of the operations up to h: the condition's status word
 * sits beside its completion word (completion + 1) and holds the sequence
 * number of the latest operation that failed (a dead peer, a timeout, a
 * canceled operation), stored before the completion word advances past it.
 * Read it after ucpx_wait (or a true ucpx_test): 0 when none of the
 * operations up to completion_value is known to have failed, else the
 * sequence number of the latest failed one (a value above the previous
 * handle's completion_value means this launch's data is bad: skip it). The
 * host reads the same with Condition.StatusAt. */
static __device__ __forceinline__ uint64_t ucpx_status(ucpx_device_handle h)
{
	if (h.completion == 0)
		return 0;
	uint64_t s = ucpx_word_load_acquire(h.completion + 1);
	if (s == 0 || (int64_t)(h.completion_value - s) < 0)
		return 0;
	return s;
}

/* Copies n bytes with lanes lane, lane+lanes, ...: 16-byte stores where dst,
 * src and n allow them, bytes otherwise (the put-with-signal functions below). */
typedef struct __attribute__((aligned(16))) {
	uint64_t lo, hi;
} ucpx_v16;

static __device__ __forceinline__ void ucpx_copy_lanes(void *dst, const void *src, uint64_t n, uint64_t lane, uint64_t lanes)
{
	if ((((uintptr_t)dst | (uintptr_t)src | n) & 15) == 0) {
		ucpx_v16 *d = (ucpx_v16 *)dst;
		const ucpx_v16 *s = (const ucpx_v16 *)src;
		for (uint64_t i = lane; i < n / 16; i += lanes)
			d[i] = s[i];
	} else {
		uint8_t *d = (uint8_t *)dst;
		const uint8_t *s = (const uint8_t *)src;
		for (uint64_t i = lane; i < n; i += lanes)
			d[i] = s[i];
	}
}

/*
 * Prepared, partitioned operations (package prepare): the device side of
 * MPI_Pready and MPI_Parrived.
 *
 * ucpx_partition_handle is the POD a kernel receives (by value) from
 * prepare.Request.DeviceHandle().Kernel(). Fetch it after every Start: it
 * names the current iteration. Eleven 8-byte members, no padding: 88 bytes,
 * 8-byte aligned. The Go mirror is device.PartitionHandle.
 *
 *   words            sender: the ready flags, one per own partition (the
 *                    receiver's Start stores the iteration into each, taking
 *                    one stores 0); receiver: the
 *                    arrival counters, one per SENDER partition (each
 *                    partition's put adds 1 to its counter after its data)
 *   triggers         sender: the address of each partition's trigger word
 *                    (triggers[p]); receiver: NULL
 *   trigger_value    sender: what ucpx_pready stores into triggers[p] in this
 *                    iteration; receiver: 0
 *   iteration        the iteration the handle belongs to (1, 2, ...)
 *   failed           the value every word holds once the peer failed
 *   partitions       this side's number of partitions
 *   part_bytes       this side's partition size in bytes
 *   peer_part_bytes  the peer's partition size in bytes (the two sides'
 *                    partition counts may differ)
 *   buf, peer_buf,   a sender on the direct path (a receiver's device buffer
 *   peer_words       that CUDA IPC maps here): this side's buffer, the
 *                    receiver's buffer and arrival counters mapped in this
 *                    process; ucpx_pready then moves the partition itself.
 *                    NULL otherwise.
 *
 * Expected use: one thread block per partition. The block writes its
 * partition, then calls ucpx_pready_block (all threads), or __syncthreads()
 * and ucpx_pready from one thread. On the receiver a block waits with
 * ucpx_parrived_wait_block (or one thread with ucpx_parrived_wait, then
 * __syncthreads()) before reading its partition. The functions wait on words
 * the host and the network write, so the kernels of the two sides may run
 * concurrently on one GPU only if every block of both fits at once.
 */
typedef struct ucpx_partition_handle {
	uint64_t *words;
	uint64_t *const *triggers;
	uint64_t trigger_value;
	uint64_t iteration;
	uint64_t failed;
	uint64_t partitions;
	uint64_t part_bytes;
	uint64_t peer_part_bytes;
	const uint8_t *buf;
	uint8_t *peer_buf;
	uint64_t *peer_words;
} ucpx_partition_handle;

/* ucpx_pstatus results. */
#define UCPX_PART_PENDING 0 /* not yet (receiver: not arrived) */
#define UCPX_PART_DONE 1    /* arrived */
#define UCPX_PART_FAILED -1 /* the peer failed, or p is not a partition of h */

/*
 * Make sender partition p ready (MPI_Pready) from ONE thread: wait until the
 * receiver is ready for this iteration (its Start set ready flag p), take the
 * flag (store 0) and store h.trigger_value into partition p's trigger word
 * with release semantics (this thread's earlier writes are visible
 * system-wide first). ucpx then moves the partition with one put-with-signal.
 * On the direct path (h.peer_buf set) the calling thread copies the partition
 * into the receiver's buffer itself, marks the flag moved and stores the
 * iteration into the receiver's arrival counter: nothing of the host runs
 * (ucpx_pready_block copies with the whole block). Other threads of the block
 * must have made their writes visible to the calling thread first
 * (__syncthreads()), as for ucpx_trigger; ucpx_pready_block does all of it for
 * a whole block.
 *
 * Returns true once the partition was handed over, false if the peer failed
 * (the flag holds h.failed: nothing is moved, the host reports the error) or
 * h is not a sender's handle or p is out of range. Call it once per partition
 * per iteration: a second call waits for a flag that is not set again before
 * the next iteration.
 */
/* A direct-path sender's ready flag holds UCPX_PART_MOVED | i once the kernel
 * moved the partition in iteration i: how the host sees the partition's send
 * complete without waiting for the receiver. */
#define UCPX_PART_MOVED (1ull << 63)

/* Waits until ready flag p holds an iteration (the receiver's Start stored it;
 * not yet marked moved) and returns it, or 0 if the peer failed. The flag is
 * not cleared: the kernel marks it moved once the partition is in place, which
 * is what a second call in the same iteration waits behind. */
static __device__ __forceinline__ uint64_t ucpx_ready_iteration(ucpx_partition_handle h, uint64_t p)
{
	uint64_t v;
	while ((v = ucpx_word_load_acquire(h.words + p)) == 0 || (v & UCPX_PART_MOVED) != 0) {
	}
	return v == h.failed ? 0 : v;
}

/* The direct path's hand-over, by the thread that read ready iteration v after
 * the partition's bytes reached the receiver's buffer (its own stores, or those
 * of threads that passed a barrier with it): mark the flag moved (the host's
 * send completion), then publish the arrival. One system-scope fence, the
 * release's, orders the data and the mark before the counter: the receiver's
 * next Start, which stores the sender's flag again, can only follow the mark. */
static __device__ __forceinline__ void ucpx_direct_arrive(ucpx_partition_handle h, uint64_t p, uint64_t v)
{
	ucpx_word_store_relaxed(h.words + p, UCPX_PART_MOVED | v);
	ucpx_word_store_release(h.peer_words + p, v);
}

static __device__ __forceinline__ bool ucpx_pready(ucpx_partition_handle h, uint64_t p)
{
	if (p >= h.partitions || (h.triggers == 0 && h.peer_buf == 0))
		return false;
	if (h.peer_buf) {
		/* The direct path: the partition goes straight into the receiver's
		 * buffer, then its arrival counter gets the iteration. */
		uint64_t v = ucpx_ready_iteration(h, p);
		if (v == 0)
			return false; /* the peer failed */
		uint64_t off = p * h.part_bytes;
		ucpx_copy_lanes(h.peer_buf + off, h.buf + off, h.part_bytes, 0, 1);
		ucpx_direct_arrive(h, p, v);
		return true;
	}
	uint64_t *trigger = h.triggers[p]; /* written before the launch; overlaps the first poll */
	uint64_t v = ucpx_ready_iteration(h, p);
	if (v == 0)
		return false; /* the peer failed */
	/* Taken (0) before the put moves the partition, so the receiver's next
	 * Start finds it 0 and sets it again; the trigger's release orders the
	 * take and the data before it. */
	ucpx_word_store_relaxed(h.words + p, 0);
	ucpx_word_store_release(trigger, h.trigger_value);
	return true;
}

/*
 * ucpx_pready for a whole thread block: every thread of the block calls it
 * after writing its share of partition p. A barrier orders the block's writes
 * before thread (0,0,0), which takes the ready flag; every thread gets the
 * result. On the direct path the whole block copies the partition into the
 * receiver's buffer; a barrier then hands the copies to thread (0,0,0), whose
 * release store publishes them (no fence per thread).
 */
static __device__ __forceinline__ bool ucpx_pready_block(ucpx_partition_handle h, uint64_t p)
{
	bool leader = threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0;
	__syncthreads();
	if (h.peer_buf == 0) {
		int ok = 0;
		if (leader)
			ok = ucpx_pready(h, p);
		return __syncthreads_or(ok) != 0;
	}
	/* volatile: the non-leading threads must read it after the barrier (clang
	 * otherwise loads it early: nothing it sees writes shared memory). */
	__shared__ volatile uint64_t ucpx_ready_iter;
	if (leader)
		ucpx_ready_iter = p < h.partitions ? ucpx_ready_iteration(h, p) : 0;
	__syncthreads();
	uint64_t v = ucpx_ready_iter;
	if (v == 0)
		return false;
	uint64_t off = p * h.part_bytes;
	uint64_t lane = threadIdx.x + (uint64_t)blockDim.x * (threadIdx.y + (uint64_t)blockDim.y * threadIdx.z);
	ucpx_copy_lanes(h.peer_buf + off, h.buf + off, h.part_bytes, lane, (uint64_t)blockDim.x * blockDim.y * blockDim.z);
	__syncthreads();
	if (leader)
		ucpx_direct_arrive(h, p, v);
	return true;
}

/*
 * State of receive partition q in the handle's iteration: UCPX_PART_DONE once
 * every sender partition overlapping it has arrived (its counter has reached
 * h.iteration), UCPX_PART_PENDING before, UCPX_PART_FAILED if the peer failed
 * (every counter holds h.failed) or q is out of range. Non-blocking; acquire
 * loads, so after UCPX_PART_DONE this thread sees the partition's data.
 */
static __device__ __forceinline__ int ucpx_pstatus(ucpx_partition_handle h, uint64_t q)
{
	if (h.triggers != 0 || q >= h.partitions || h.peer_part_bytes == 0)
		return UCPX_PART_FAILED;
	uint64_t off = q * h.part_bytes;
	uint64_t first = off / h.peer_part_bytes, last = (off + h.part_bytes - 1) / h.peer_part_bytes;
	int st = UCPX_PART_DONE;
	for (uint64_t sp = first; sp <= last; sp++) {
		uint64_t v = ucpx_word_load_acquire(h.words + sp);
		if (v == h.failed)
			return UCPX_PART_FAILED;
		if (!ucpx_word_reached(v, h.iteration))
			st = UCPX_PART_PENDING;
	}
	return st;
}

/* Has receive partition q of this iteration arrived (MPI_Parrived)? False
 * while it has not and when the peer failed: tell them apart with
 * ucpx_pstatus. */
static __device__ __forceinline__ bool ucpx_parrived(ucpx_partition_handle h, uint64_t q)
{
	return ucpx_pstatus(h, q) == UCPX_PART_DONE;
}

/* Wait (one thread) until receive partition q has arrived: true, with the
 * data visible to this thread; false if the peer failed. */
static __device__ __forceinline__ bool ucpx_parrived_wait(ucpx_partition_handle h, uint64_t q)
{
	int st;
	while ((st = ucpx_pstatus(h, q)) == UCPX_PART_PENDING) {
	}
	return st == UCPX_PART_DONE;
}

/* ucpx_parrived_wait for a whole thread block: thread (0,0,0) waits, a
 * barrier passes the data's visibility and the result to every thread. */
static __device__ __forceinline__ bool ucpx_parrived_wait_block(ucpx_partition_handle h, uint64_t q)
{
	bool leader = threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0;
	int ok = 0;
	if (leader)
		ok = ucpx_parrived_wait(h, q);
	return __syncthreads_or(ok) != 0;
}

/*
 * Kernel-initiated put with signal to a same-host peer (CUDA IPC), what
 * NVSHMEM's putmem_signal does within a node. dst and flag are the peer's
 * device memory mapped in this process: ucp.Rkey.DeviceAddress on keys of the
 * peer's device regions (ucp.ContextParams.Device). The data is written with
 * ordinary stores, the writers pass a barrier (warp or block), then one thread stores
 * value into the flag with release semantics: a peer that sees the value with
 * an acquire load (ucpx_word_wait_geq) or a stream memop wait also sees the
 * data. Nothing on the host takes part.
 *
 *   ucpx_put_signal        one thread copies and signals;
 *   ucpx_put_signal_warp   the calling warp copies, lane 0 signals (all 32
 *                          lanes call it);
 *   ucpx_put_signal_block  the calling block copies, thread (0,0,0) signals
 *                          (every thread calls it).
 *
 * 16-byte stores where dst, src and n allow them, bytes otherwise.
 */
static __device__ __forceinline__ void ucpx_put_signal(void *dst, const void *src, uint64_t n, uint64_t *flag, uint64_t value)
{
	ucpx_copy_lanes(dst, src, n, 0, 1);
	ucpx_word_store_release(flag, value);
}

static __device__ __forceinline__ void ucpx_put_signal_warp(void *dst, const void *src, uint64_t n, uint64_t *flag, uint64_t value)
{
	unsigned lane = threadIdx.x & 31;
	ucpx_copy_lanes(dst, src, n, lane, 32);
	__syncwarp();
	if (lane == 0)
		ucpx_word_store_release(flag, value);
}

static __device__ __forceinline__ void ucpx_put_signal_block(void *dst, const void *src, uint64_t n, uint64_t *flag, uint64_t value)
{
	uint64_t lane = threadIdx.x + (uint64_t)blockDim.x * (threadIdx.y + (uint64_t)blockDim.y * threadIdx.z);
	ucpx_copy_lanes(dst, src, n, lane, (uint64_t)blockDim.x * blockDim.y * blockDim.z);
	__syncthreads();
	if (lane == 0)
		ucpx_word_store_release(flag, value);
}

#endif /* UCPX_SIGNAL_CUH */
