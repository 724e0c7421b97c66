// Internal to the wgmma prefill kernel (paged_prefill_wgmma.cu; sm_90a only): the inline PTX it
// issues beyond wgmma_primitives.cuh (its two wgmma shapes, the L1 prefetch, the uncached break
// load, cp.async's wait with a pending count, the descriptor advance) and the operand fences
// over its fragment arrays. Apart from the kernel so that its file holds the algorithm.
#ifndef LAZYATTN_KERNELS_CUDA_PAGED_PREFILL_WGMMA_OPS_CUH_
#define LAZYATTN_KERNELS_CUDA_PAGED_PREFILL_WGMMA_OPS_CUH_

#include <cstdint>

#include "kernels/cuda/wgmma_primitives.cuh"

namespace lazyattn::prefill_internal {

// A hint: brings the line holding `ptr` (global memory) into L1.
__device__ __forceinline__ void PrefetchL1(const void* ptr) {
  asm volatile("prefetch.global.L1 [%0];\n" ::"l"(__cvta_generic_to_global(ptr)));
}

// breaks[i] (global memory, read-only for the kernel). Volatile asm so that ptxas keeps the load
// and its address arithmetic inside the rare branch that needs it instead of hoisting them into
// every tile.
__device__ __forceinline__ int LoadBreak(const int* breaks, int i) {
  int v;
  asm volatile(
      "{\n.reg .s64 a;\nmul.wide.s32 a, %1, 4;\nadd.s64 a, a, %2;\n"
      "ld.global.nc.b32 %0, [a];\n}\n"
      : "=r"(v)
      : "r"(i), "l"(breaks));
  return v;
}

// `desc` with its start address `bytes` (a multiple of 16) further: only the 14-bit address
// field changes, and it does not carry out while the operand stays in the 256 KB the field spans
// (shared memory here is 228 KB). One add per wgmma instead of rebuilding the descriptor.
__device__ __forceinline__ uint64_t DescAdvance(uint64_t desc, uint32_t bytes) {
  const uint32_t lo = static_cast<uint32_t>(desc) + (bytes >> 4);
  return (static_cast<uint64_t>(static_cast<uint32_t>(desc >> 32)) << 32) | lo;
}

template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// S (64 x 64 fp32 per warpgroup) = q (registers, 64 x 16 bf16) x K^T (K-major descriptor), or
// += with kAccumulate (scale-d; without it the accumulators are not read).
template <bool kAccumulate>
__device__ __forceinline__ void WgmmaQk(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, "
      "%8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, "
      "%24, %25, %26, %27, %28, %29, %30, %31}, "
      "{%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "n"(kAccumulate ? 1 : 0));
}

// O (64 x 128 fp32 per warpgroup) += P (registers, 64 x 16 bf16) x V (MN-major: imm-trans-b 1).
__device__ __forceinline__ void WgmmaPv(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, "
      "%8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, "
      "%24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, "
      "%40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, "
      "%56, %57, %58, %59, %60, %61, %62, %63}, "
      "{%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
        "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
        "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b));
}

// WgmmaFenceOperand over every register of a fragment array.
template <int N>
__device__ __forceinline__ void FenceOperands(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) WgmmaFenceOperand(r[i]);
}
template <int M, int N>
__device__ __forceinline__ void FenceOperands(uint32_t (&r)[M][N]) {
#pragma unroll
  for (int i = 0; i < M; ++i) {
#pragma unroll
    for (int j = 0; j < N; ++j) WgmmaFenceOperand(r[i][j]);
  }
}

}  // namespace lazyattn::prefill_internal

#endif  // LAZYATTN_KERNELS_CUDA_PAGED_PREFILL_WGMMA_OPS_CUH_
