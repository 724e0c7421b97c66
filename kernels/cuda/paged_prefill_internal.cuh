// Internal to the paged prefill attention (not a public header): what the launcher and the merge
// (paged_prefill_attention.cu), the mma.sync kernel (paged_prefill_mma_sync.cu) and the wgmma
// kernel (paged_prefill_wgmma_ws.cu, compiled separately for sm_90a) share: the kernel
// parameters, the small device helpers both kernels use, and the mma.sync kernel's launcher (the
// wgmma kernel's is in paged_prefill_wgmma_ws.cuh). The tiling constants the plan is built for
// are in paged_prefill_tiling.h, which host-only code can include.
#ifndef LAZYATTN_KERNELS_CUDA_PAGED_PREFILL_INTERNAL_CUH_
#define LAZYATTN_KERNELS_CUDA_PAGED_PREFILL_INTERNAL_CUH_

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/paged_prefill_attention.h"
#include "kernels/cuda/paged_prefill_tiling.h"

namespace lazyattn::prefill_internal {

struct Params {
  const __nv_bfloat16* __restrict__ q;
  const __nv_bfloat16* __restrict__ k_pool;
  const __nv_bfloat16* __restrict__ v_pool;
  __nv_bfloat16* __restrict__ out;
  const float* __restrict__ rope_cos;
  const float* __restrict__ rope_sin;
  const int* __restrict__ seqs;
  const int4* __restrict__ entries;
  const int* __restrict__ breaks;  // the plan's plain-tile break points (wgmma kRotateQ only)
  const int* __restrict__ work;
  const int* __restrict__ combine;
  float* __restrict__ part_o;    // [partial][kv_heads][kBlockM][D]
  float* __restrict__ part_lse;  // [partial][kv_heads][kBlockM], log2 domain
  int64_t block_stride;          // elements per physical block (all KV heads)
  int num_heads, num_kv_heads, group;
  float scale_log2;
};

// A CTA's work item and the words of its sequence, read where the plan wrote them (the layouts
// are paged_prefill_attention.h's "metadata"). Both kernels start from it; a field a kernel
// never reads costs it nothing.
struct WorkItem {
  int seq, m_tok0, n_tok, t_begin, t_end, partial;
  int first_break;  // the range's first tile that is not plain from q' = q (wgmma kRotateQ)
  int q_start, entry_start, num_entries, first_query_index;
  int break_start;  // this sequence's `breaks` (wgmma kRotateQ)
};
__device__ __forceinline__ WorkItem LoadWorkItem(const Params& p, int item) {
  const int* w = p.work + static_cast<int64_t>(item) * kWorkWords;
  WorkItem x;
  x.seq = w[0];
  x.m_tok0 = w[1];
  x.n_tok = w[2];
  x.t_begin = w[3];
  x.t_end = w[4];
  x.partial = w[5];
  x.first_break = w[6];
  const int* sq = p.seqs + x.seq * kSeqWords;
  x.q_start = sq[0];
  x.entry_start = sq[2];
  x.num_entries = sq[3];
  x.first_query_index = sq[4];
  x.break_start = sq[5];
  return x;
}

// 16-byte async copy; copies zeros (reads nothing) when !valid.
__device__ __forceinline__ void CpAsync16(uint32_t dst, const void* src, bool valid) {
  const int n = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n));
}
__device__ __forceinline__ void CpAsyncWaitAll() {
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}

__device__ __forceinline__ void Ldmatrix4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

__device__ __forceinline__ float Exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float2 UnpackBf16(uint32_t v) {
  return __bfloat1622float2(*reinterpret_cast<__nv_bfloat162*>(&v));
}

// Byte offset of 16-byte chunk `chunk` of row `row` in a swizzled [rows][D] bf16 tile.
template <int D>
__device__ __forceinline__ uint32_t Swz(int row, int chunk) {
  return row * (D * 2) + ((chunk ^ (row & 7)) << 4);
}

// The attention pass of the mma.sync kernel (paged_prefill_mma_sync.cu, which instantiates it for
// head_dim 64 and 128 and every rotation); the caller launches the merge of split-KV partials
// after it.
template <int D, PrefillRotation kRot>
absl::Status LaunchMmaSync(const PagedPrefillPlan& plan, const Params& params,
                           cudaStream_t stream);

}  // namespace lazyattn::prefill_internal

#endif  // LAZYATTN_KERNELS_CUDA_PAGED_PREFILL_INTERNAL_CUH_
