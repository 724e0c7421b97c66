// Inline PTX wrappers shared by the attention kernels (sm_80+ instructions, used on sm_90):
// shared-memory addressing, cp.async group commit, the bf16 m16n8k16 tensor-core MMA and bf16
// packing. Kernel-specific variants (cp.async with cache hints or zero-fill rules, ldmatrix
// layouts) stay in the kernel that needs them.
#ifndef LAZYATTN_KERNELS_CUDA_TENSOR_CORE_PRIMITIVES_CUH_
#define LAZYATTN_KERNELS_CUDA_TENSOR_CORE_PRIMITIVES_CUH_

#include <cuda_bf16.h>

#include <cstdint>

namespace lazyattn {

__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }

// d += a * b for one 16x8x16 tile: a is 4 registers of bf16 pairs (row-major 16x16), b two
// registers (col-major 16x8), d four fp32 accumulators.
__device__ __forceinline__ void Mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats rounded to bf16 (round to nearest even) in one 32-bit word, `lo` in the low half.
__device__ __forceinline__ uint32_t PackBf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

}  // namespace lazyattn

#endif  // LAZYATTN_KERNELS_CUDA_TENSOR_CORE_PRIMITIVES_CUH_
