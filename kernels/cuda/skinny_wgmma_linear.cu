// Few-row linear layers on Hopper tensor cores, host side (skinny_wgmma_linear.h has the
// contract): argument checks, the tile width and K-split choice, the tensor maps and the split-K
// workspace. The kernel and its design are skinny_wgmma_kernel.cu; the weight packing
// skinny_wgmma_pack.cu.
#include "kernels/cuda/skinny_wgmma_linear.h"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/rope_kv_append.h"
#include "kernels/cuda/skinny_wgmma_internal.cuh"

namespace lazyattn {
namespace {

using skinny_wgmma_internal::CtasPerSm;
using skinny_wgmma_internal::kMaxSplits;
using skinny_wgmma_internal::kPartialFloats;
using skinny_wgmma_internal::kTileK;
using skinny_wgmma_internal::kTileM;
using skinny_wgmma_internal::LaunchRows;
using skinny_wgmma_internal::Params;

PFN_cuTensorMapEncodeTiled_v12000 EncodeTiled() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult result{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault,
                                         &result) != cudaSuccess ||
        result != cudaDriverEntryPointSuccess) {
      f = nullptr;
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

// A 2-D bf16 tensor map over a row-major [rows][cols] matrix, boxes of box_rows x 64 columns,
// 128-byte swizzle; reads past the matrix fill zeros.
absl::Status MakeMap(CUtensorMap* map, const void* ptr, int64_t rows, int64_t cols,
                     int box_rows) {
  auto encode = EncodeTiled();
  if (encode == nullptr) return absl::InternalError("cuTensorMapEncodeTiled is unavailable");
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(cols) * 2};
  const cuuint32_t box[2] = {kTileK, static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult r = encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(ptr),
                            dims, strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                            CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    return absl::InternalError(absl::StrCat("cuTensorMapEncodeTiled failed: ", int(r)));
  }
  return absl::OkStatus();
}

int SmCount() {
  static const int count = [] {
    int device = 0, n = 0;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device);
    return n;
  }();
  return count;
}

int CeilDiv(int64_t a, int64_t b) { return static_cast<int>((a + b - 1) / b); }

// The K splits a tile width allows: at least 4 K blocks per split on average, and partial tiles
// that fit the workspace.
int MaxSplits(int m, int row_tile, int64_t in, int64_t out) {
  const int tiles = CeilDiv(out, kTileM * m);
  const int64_t tile_floats = int64_t{kTileM} * m * row_tile;
  const int64_t by_space = kPartialFloats / (tile_floats * tiles);
  return static_cast<int>(std::clamp<int64_t>(
      std::min<int64_t>(CeilDiv(in, kTileK) / 4, by_space), 1, kMaxSplits));
}

// Tile width and K splits for a product (the caller's where it gave them): 64-feature tiles
// with as many K splits as fill every CTA slot once, or, where the 64-feature tiles alone
// outnumber the slots (gate_up, the LM head), 128-feature tiles unsplit. Timing every cut of
// the llama3-8b products at 1-64 rows on the H200 put this choice within 0-6 % of the best cut
// (docs/kernels.md). Without a workspace (`can_split` false) the kernel's own choice never
// splits.
SkinnyWgmmaConfig Choose(int row_tile, int64_t in, int64_t out, SkinnyWgmmaConfig config,
                         bool can_split) {
  int features = config.tile_features;
  if (features == 0) {
    features = CeilDiv(out, kTileM) > SmCount() * CtasPerSm(1, row_tile) ? 2 * kTileM : kTileM;
  }
  const int m = features / kTileM;
  const int tiles = CeilDiv(out, features);
  const int max_splits = MaxSplits(m, row_tile, in, out);
  int splits = 1;
  if (config.splits > 0) {
    splits = std::min(config.splits, max_splits);
  } else if (can_split) {
    splits = std::clamp(SmCount() * CtasPerSm(m, row_tile) / tiles, 1, max_splits);
  }
  return {.tile_features = features, .splits = splits};
}

}  // namespace

SkinnyWgmmaWorkspace::~SkinnyWgmmaWorkspace() {
  if (counters_ != nullptr) cudaFree(counters_);
  if (partials_ != nullptr) cudaFree(partials_);
}

absl::Status SkinnyWgmmaWorkspace::Init() {
  if (partials_ == nullptr) {
    RETURN_IF_CUDA_ERROR(cudaMalloc(&partials_, kPartialFloats * sizeof(float)));
  }
  if (counters_ == nullptr) {
    int* counters = nullptr;
    RETURN_IF_CUDA_ERROR(cudaMalloc(&counters, kMaxTiles * sizeof(int)));
    // cudaMemset may return before the zeros land, and a kernel on a non-blocking stream need
    // not wait for it: synchronize, so the counters are zero before any call can use them.
    cudaError_t e = cudaMemset(counters, 0, kMaxTiles * sizeof(int));
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
      cudaFree(counters);
      RETURN_IF_CUDA_ERROR(e);
    }
    counters_ = counters;  // published only once zeroed: a retry starts over
  }
  return absl::OkStatus();
}

bool SkinnyWgmmaLinearSupports(int64_t rows, int64_t in, int64_t out, const void* x,
                               const void* w, const void* y) {
  static const bool hopper = [] {
    int device = 0, major = 0, minor = 0;
    return cudaGetDevice(&device) == cudaSuccess &&
           cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) ==
               cudaSuccess &&
           cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) ==
               cudaSuccess &&
           major == 9 && minor == 0;
  }();
  auto aligned = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
  // Sizes are checked as int64 before anything narrows them to int.
  return hopper && rows >= 1 && rows <= 64 && in >= kTileK && in % 8 == 0 &&
         in <= (int64_t{1} << 30) && out >= 1 &&
         out <= int64_t{SkinnyWgmmaWorkspace::kMaxTiles} * kTileM && aligned(x) && aligned(w) &&
         aligned(y);
}

namespace {

int RowTile(int64_t rows) { return rows <= 8 ? 8 : rows <= 16 ? 16 : rows <= 32 ? 32 : 64; }

// Both forms: `out` output features of y, or with swiglu_inter > 0 the SwiGLU form's inter
// features from 2 * inter weight rows (its tiles are always 128 weight rows).
absl::Status Run(const __nv_bfloat16* x, const __nv_bfloat16* w, int64_t rows, int64_t in,
                 int64_t out, void* y, GemmOutputType y_type, bool accumulate, int64_t swiglu_inter,
                 const RopeKvAppendArgs* rope, const SkinnyWgmmaWorkspace& workspace,
                 cudaStream_t stream, SkinnyWgmmaConfig config, const __nv_bfloat16* w_packed) {
  if (w_packed != nullptr && reinterpret_cast<uintptr_t>(w_packed) % 16 != 0) {
    return absl::InvalidArgumentError("skinny wgmma linear: packed weights must be 16-byte aligned");
  }
  if (w_packed != nullptr && swiglu_inter % kTileM != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "skinny wgmma linear: packed gate/up weights need inter a multiple of 64, not ",
        swiglu_inter));
  }
  if (config.tile_features != 0 && config.tile_features != 64 && config.tile_features != 128 &&
      config.tile_features != 256) {
    return absl::InvalidArgumentError(absl::StrCat(
        "skinny wgmma linear: tile_features must be 64, 128 or 256, not ", config.tile_features));
  }
  if (config.splits < 0 || config.splits > kMaxSplits) {
    return absl::InvalidArgumentError(absl::StrCat("skinny wgmma linear: splits must be 0 to ",
                                                   kMaxSplits, ", not ", config.splits));
  }
  const int row_tile = RowTile(rows);
  const bool can_split = workspace.counters() != nullptr && workspace.partials() != nullptr;
  const SkinnyWgmmaConfig chosen = Choose(row_tile, in, out, config, can_split);
  if (chosen.splits > 1 && !can_split) {
    return absl::FailedPreconditionError(
        "skinny wgmma linear: config.splits > 1 needs an initialized workspace");
  }
  const int m = chosen.tile_features / kTileM;
  CUtensorMap map_w, map_x;
  RETURN_IF_ERROR(MakeMap(&map_w, w, out, in, swiglu_inter > 0 ? kTileM : chosen.tile_features));
  RETURN_IF_ERROR(MakeMap(&map_x, x, rows, in, row_tile));
  const Params p{.y = y,
                 .rows = static_cast<int>(rows),
                 .in = static_cast<int>(in),
                 .out = static_cast<int>(swiglu_inter > 0 ? swiglu_inter : out),
                 .k_blocks = CeilDiv(in, kTileK),
                 .splits = chosen.splits,
                 .swiglu_inter = static_cast<int>(swiglu_inter),
                 .rope = rope != nullptr ? *rope : RopeKvAppendArgs{},
                 .y_fp32 = y_type == GemmOutputType::kFp32,
                 .accumulate = accumulate,
                 .counters = workspace.counters(),
                 .partials = workspace.partials(),
                 .packed_w = w_packed};
  switch (row_tile) {
    case 8:
      return LaunchRows<8>(m, rope != nullptr, map_w, map_x, p, stream);
    case 16:
      return LaunchRows<16>(m, rope != nullptr, map_w, map_x, p, stream);
    case 32:
      return LaunchRows<32>(m, rope != nullptr, map_w, map_x, p, stream);
    default:
      return LaunchRows<64>(m, rope != nullptr, map_w, map_x, p, stream);
  }
}

}  // namespace

absl::Status SkinnyWgmmaLinearCuda(const __nv_bfloat16* x, const __nv_bfloat16* w, int64_t rows,
                                   int64_t in, int64_t out, void* y, GemmOutputType y_type,
                                   bool accumulate, const SkinnyWgmmaWorkspace& workspace,
                                   cudaStream_t stream, SkinnyWgmmaConfig config,
                                   const __nv_bfloat16* w_packed) {
  if (!SkinnyWgmmaLinearSupports(rows, in, out, x, w, y)) {
    return absl::InvalidArgumentError(absl::StrCat("skinny wgmma linear: unsupported product ",
                                                   rows, "x", in, " * ", out, "x", in, "^T"));
  }
  return Run(x, w, rows, in, out, y, y_type, accumulate, /*swiglu_inter=*/0, /*rope=*/nullptr,
             workspace, stream, config, w_packed);
}

absl::Status SkinnyWgmmaLinearSwiGluCuda(const __nv_bfloat16* x, const __nv_bfloat16* w_gate_up,
                                         int64_t rows, int64_t in, int64_t inter,
                                         __nv_bfloat16* act, const SkinnyWgmmaWorkspace& workspace,
                                         cudaStream_t stream, SkinnyWgmmaConfig config,
                                         const __nv_bfloat16* w_packed) {
  if (inter < 1 || !SkinnyWgmmaLinearSupports(rows, in, 2 * inter, x, w_gate_up, act)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "skinny wgmma linear: unsupported SwiGLU product ", rows, "x", in, " * ", 2 * inter, "x",
        in, "^T"));
  }
  if (config.tile_features != 0 && config.tile_features != kTileM &&
      config.tile_features != 2 * kTileM) {
    return absl::InvalidArgumentError(absl::StrCat(
        "skinny wgmma linear: the SwiGLU form's tiles are 64 or 128 features, not ",
        config.tile_features));
  }
  // A tile of F features reads 2 F weight rows (gate and up), the plain form's tile of 2 F.
  const int features = config.tile_features != 0 ? config.tile_features : kTileM;
  return Run(x, w_gate_up, rows, in, 2 * inter, act, GemmOutputType::kBf16,
             /*accumulate=*/false, inter, /*rope=*/nullptr, workspace, stream,
             {.tile_features = 2 * features, .splits = config.splits}, w_packed);
}

bool SkinnyWgmmaQkvRopeSupports(int64_t rows, int64_t in, const RopeKvAppendArgs& a,
                                const void* x, const void* w_qkv) {
  return a.head_dim == 2 * kTileM && a.rope.head_dim == a.head_dim && a.rope.cos != nullptr &&
         a.rope.sin != nullptr && a.rope.max_positions > 0 && a.num_heads > 0 &&
         a.num_kv_heads > 0 && a.num_tokens == rows && a.local_positions != nullptr &&
         a.deltas != nullptr && a.slots != nullptr && a.k_pool != nullptr &&
         a.v_pool != nullptr &&
         SkinnyWgmmaLinearSupports(rows, in,
                                   int64_t{a.num_heads + 2 * a.num_kv_heads} * a.head_dim, x,
                                   w_qkv, a.q_out);
}

absl::Status SkinnyWgmmaLinearQkvRopeCuda(const __nv_bfloat16* x, const __nv_bfloat16* w_qkv,
                                          int64_t rows, int64_t in, const RopeKvAppendArgs& rope,
                                          const SkinnyWgmmaWorkspace& workspace,
                                          cudaStream_t stream, SkinnyWgmmaConfig config,
                                          const __nv_bfloat16* w_packed) {
  if (!SkinnyWgmmaQkvRopeSupports(rows, in, rope, x, w_qkv)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "skinny wgmma linear: unsupported QKV + RoPE product: ", rows, " rows, in ", in,
        ", heads ", rope.num_heads, "/", rope.num_kv_heads, ", head_dim ", rope.head_dim,
        " (needs head_dim 128 and a complete RopeKvAppendArgs)"));
  }
  if (config.tile_features != 0 && config.tile_features != 2 * kTileM) {
    return absl::InvalidArgumentError(absl::StrCat(
        "skinny wgmma linear: the QKV + RoPE form's tiles are one head (128 features), not ",
        config.tile_features));
  }
  const int64_t out = int64_t{rope.num_heads + 2 * rope.num_kv_heads} * rope.head_dim;
  return Run(x, w_qkv, rows, in, out, rope.q_out, GemmOutputType::kBf16, /*accumulate=*/false,
             /*swiglu_inter=*/0, &rope, workspace, stream,
             {.tile_features = 2 * kTileM, .splits = config.splits}, w_packed);
}

SkinnyWgmmaConfig SkinnyWgmmaChosenConfig(int64_t rows, int64_t in, int64_t out,
                                          SkinnyWgmmaConfig config) {
  return Choose(RowTile(rows), in, out, config, /*can_split=*/true);
}

}  // namespace lazyattn
