/*
 * Lets clang compile test_kernels.cu to PTX without a CUDA toolkit
 * (scripts/ptx.sh uses it only when nvcc is absent): the few CUDA keywords and
 * device functions the kernels use, mapped to clang's NVPTX builtins.
 */
#define __device__ __attribute__((device))
#define __global__ __attribute__((global))
#define __host__ __attribute__((host))
#define __shared__ __attribute__((shared))
#define __forceinline__ __inline__ __attribute__((always_inline))
#include <__clang_cuda_builtin_vars.h>
static __device__ inline void __threadfence_system(void) { __nvvm_membar_sys(); }
static __device__ inline int __syncthreads_or(int predicate) { return __nvvm_bar0_or(predicate); }
static __device__ inline void __syncwarp(unsigned mask = 0xffffffffu) { asm volatile("bar.warp.sync %0;" ::"r"(mask) : "memory"); }
static __device__ inline unsigned long long atomicAdd(unsigned long long *p, unsigned long long v)
{
	return (unsigned long long)__nvvm_atom_add_gen_ll((long long *)p, (long long)v);
}
