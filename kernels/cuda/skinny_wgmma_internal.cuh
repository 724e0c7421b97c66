// Internal to the few-row wgmma linear layers (not a public header): what the kernel
// (skinny_wgmma_kernel.cu), the host side (skinny_wgmma_linear.cu: checks, tile and split choice,
// tensor maps) and the weight packing (skinny_wgmma_pack.cu) share: the tiling, the kernel's
// parameters, and the launch of a kernel instance.
#ifndef LAZYATTN_KERNELS_CUDA_SKINNY_WGMMA_INTERNAL_CUH_
#define LAZYATTN_KERNELS_CUDA_SKINNY_WGMMA_INTERNAL_CUH_

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/rope_kv_append.h"

namespace lazyattn::skinny_wgmma_internal {

constexpr int kTileM = 64;  // output features per wgmma: its M
constexpr int kTileK = 64;  // K per stage: one 128-byte swizzle row of bf16
constexpr int kMaxStages = 8;
// Shared memory for a CTA's pipeline stages, below the 227 KB a CTA may have. Deep pipelines
// measured best: a 72 KB budget (three 64-feature CTAs an SM at every row count, 4-6 stages at
// 32-64 rows) was 0-15 % slower on 64-feature tiles at 32-64 rows and 30-34 % slower on the
// unsplit 128-feature tiles (2026-12-01, docs/kernels.md).
constexpr int kSmemBudget = 200 * 1024;

// Stages of `stage_bytes` each a CTA gets: what the budget holds, 2 to kMaxStages.
constexpr int StagesFor(int stage_bytes) {
  const int n = kSmemBudget / stage_bytes;
  return n < 2 ? 2 : n > kMaxStages ? kMaxStages : n;
}
constexpr int kConsumers = 128;          // one warpgroup
constexpr int kThreads = kConsumers + 32;
constexpr int kMaxSplits = 8;
constexpr int64_t kPartialFloats = int64_t{8} << 20;  // 32 MB of split-K partial tiles

template <int kRows, int kM>
struct Layout {
  static constexpr int kFeatures = kTileM * kM;
  static constexpr int kABytes = kFeatures * kTileK * 2;  // weights
  static constexpr int kBBytes = kRows * kTileK * 2;      // x
  static constexpr int kStageBytes = kABytes + kBBytes;
  static_assert(kStageBytes % 1024 == 0, "swizzled tiles must stay 1024-byte aligned");
  static constexpr int kStages = StagesFor(kStageBytes);
  static constexpr int kFull = kStages * kStageBytes;  // mbarriers: full[kStages], empty[kStages]
  static constexpr int kEmpty = kFull + kStages * 8;
  static constexpr int kBytes = kEmpty + kStages * 8 + 1024;  // + realignment of the base
  static constexpr int kAccumulators = kM * kRows / 2;        // fp32 registers a thread
};

struct Params {
  void* y;
  int rows, in, out, k_blocks, splits;
  // > 0: the SwiGLU form. W is [gate rows; up rows] with `swiglu_inter` rows each, a tile's two
  // 64-row halves are gate and up rows of the same 64 features, and y = silu(gate) * up, bf16
  // [rows][swiglu_inter] (`out` is then swiglu_inter).
  int swiglu_inter;
  // For the QKV form (head_dim 128, 128-feature tiles: tile t is head t of [q heads | k heads |
  // v heads]): the epilogue does RopeKvAppend's work on the tile and writes rope.q_out and the
  // pool slots; y is not written.
  RopeKvAppendArgs rope;
  bool y_fp32, accumulate;
  int* counters;    // one per tile, zero between calls
  float* partials;  // [splits][tiles][accumulators][kConsumers] when splits > 1
  // Non-null: the weights in PackWeightsForWgmma's layout, read as contiguous 8 KB blocks
  // (cp.async.bulk) instead of through map_w.
  const __nv_bfloat16* packed_w;
};

// Launches the kernel instance for row tile kRows (8, 16, 32 or 64; instantiated in
// skinny_wgmma_kernel.cu) and tile width 64 * m features (m 1, 2 or 4; with qkv_rope the QKV
// form's 128-feature instance). InternalError when the instance's shared memory does not fit.
template <int kRows>
absl::Status LaunchRows(int m, bool qkv_rope, const CUtensorMap& map_w, const CUtensorMap& map_x,
                        const Params& p, cudaStream_t stream);

// CTAs of one configuration an SM holds, from the device (at least 1 for the arithmetic).
int CtasPerSm(int m, int row_tile);

}  // namespace lazyattn::skinny_wgmma_internal

#endif  // LAZYATTN_KERNELS_CUDA_SKINNY_WGMMA_INTERNAL_CUH_
