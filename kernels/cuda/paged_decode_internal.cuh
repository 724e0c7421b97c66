// Internal to the paged decode attention (not a public header): what the kernel
// (paged_decode_kernel.cu) and its host side (paged_decode_attention.cu: checks, workspace, split
// plan, launch) share: the tiling, the kernel's parameters, and the compiled kernel instance the
// host launches.
#ifndef LAZYATTN_KERNELS_CUDA_PAGED_DECODE_INTERNAL_CUH_
#define LAZYATTN_KERNELS_CUDA_PAGED_DECODE_INTERNAL_CUH_

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/paged_decode_attention.h"

namespace lazyattn::decode_internal {

// Tiling (docs/kernels.md, "Decode attention"):
// - a CTA is 4 warps; each warp walks its own KV blocks of the CTA's range (warp w takes blocks
//   w, w+4, ...), with a private 3-stage cp.async ring in shared memory, so warps never wait on
//   each other until the epilogue;
// - per block a warp computes S = Q K^T (16 query rows x 16 tokens) and O += P V with bf16
//   mma.sync m16n8k16, fp32 accumulators, online softmax in base 2;
// - the contraction index of Q K^T is permuted so that every lane reads whole 16-byte chunks of
//   K (and of q), and the output columns are permuted so that it reads whole chunks of V: no
//   ldmatrix, no repacking of K, and shared memory is swizzled so the reads are conflict-free.
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kStages = 3;
constexpr int kBlockSize = 16;
constexpr int kRowsPerTile = 16;   // query heads per CTA (mma M)
constexpr int kMaxSplits = 256;    // per group, bounded by the merge's shared memory
constexpr int kMinBlocksPerSplit = 4;
constexpr int kMaxHeadDim = 128;
constexpr uint32_t kNoDelta = 0xffffffffu;

struct KernelParams {
  const __nv_bfloat16* q;
  const __nv_bfloat16* k_pool;
  const __nv_bfloat16* v_pool;
  const KvBlockEntry* tables;
  const int32_t* num_blocks;
  void* out;
  float* partial_out;
  float* partial_lse;
  int32_t* counters;
  const float* rope_cos;
  const float* rope_sin;
  int64_t rope_max_positions;
  int num_heads, num_kv_heads, group, head_tiles, max_blocks;
  int blocks_per_split, num_splits;
  float scale_log2;
  bool out_fp32;
  bool early_kv_loads;  // PagedDecodeArgs::early_kv_loads
};

using KernelFn = void (*)(KernelParams);

struct KernelInfo {
  KernelFn fn = nullptr;
  int smem_bytes = 0;
  int ctas_per_sm = 0;
  cudaError_t error = cudaSuccess;
};

// The kernel instance for (head_dim 64 or 128, rotate), opted into its shared memory once; `error`
// is where that failed.
const KernelInfo& SelectKernel(int head_dim, bool rotate);

}  // namespace lazyattn::decode_internal

#endif  // LAZYATTN_KERNELS_CUDA_PAGED_DECODE_INTERNAL_CUH_
