// Paged prefill attention's launcher (paged_prefill_attention.h): checks the arguments, picks
// the kernel (the mma.sync one, paged_prefill_mma_sync.cu, or the warp-specialized wgmma one,
// paged_prefill_wgmma_ws.cu) and launches it, then the merge of the split-KV partials, which both
// kernels share and which lives here. The plan is paged_prefill_plan.cc.
#include "kernels/cuda/paged_prefill_attention.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch_overlap.cuh"
#include "kernels/cuda/paged_prefill_internal.cuh"
#include "kernels/cuda/paged_prefill_wgmma_ws.cuh"
#include "kernels/cuda/tensor_core_primitives.cuh"

namespace lazyattn {
namespace {

// Shared with the kernels (paged_prefill_internal.cuh).
using prefill_internal::Exp2;
using prefill_internal::kBlockM;  // query rows per CTA
using prefill_internal::kCombineWords;
using prefill_internal::kKvBlock;  // slots per KV block
using prefill_internal::kMaxSplits;
using prefill_internal::kSeqWords;
using prefill_internal::LaunchMmaSync;
using prefill_internal::Params;

constexpr int kThreads = 128;  // the merge's CTA: 4 warps, one query row each

// Merges the splits of one query tile: out = sum_s 2^(lse_s - M) O_s / sum_s 2^(lse_s - M).
// One warp per query row (grid.z walks the tile's rows, 4 per CTA); lane s holds split s's
// weight. The partial rows of up to kMergeBatch splits are loaded at once, the first batch before
// the weights are known: a 16-split merge now waits on memory about twice, where it used to wait
// for the log-sum-exps and then once per 4 splits (measured: 8.9-9.7 against 9.8-10.0 us at q64).
constexpr int kMergeBatch = 16;

template <int D>
__global__ void __launch_bounds__(kThreads) PagedPrefillCombineKernel(const Params p) {
  // Launched overlapped: wait, then let the next kernel launch (launch_overlap.cuh).
  WaitForPrerequisiteGrid();
  AllowDependentLaunch();
  constexpr int kPerLane = D / 32;  // 4 or 2 floats: one 16- or 8-byte load per partial row
  using Vec = std::conditional_t<kPerLane == 4, float4, float2>;
  static_assert(sizeof(Vec) == kPerLane * sizeof(float));
  const int* c = p.combine + static_cast<int64_t>(blockIdx.x) * kCombineWords;
  const int seq = c[0], m_tok0 = c[1], n_tok = c[2], base = c[3], splits = c[4];
  const int kvh = blockIdx.y;
  const int lane = threadIdx.x & 31;
  const int row = blockIdx.z * (kThreads / 32) + (threadIdx.x >> 5);
  if (row >= n_tok * p.group) return;
  const int q_start = p.seqs[seq * kSeqWords];
  auto prow = [&](int s) {
    return (static_cast<int64_t>(base + s) * p.num_kv_heads + kvh) * kBlockM + row;
  };
  Vec v[kMergeBatch];
  auto load_batch = [&](int s0) {
#pragma unroll
    for (int j = 0; j < kMergeBatch; ++j) {
      const int s = s0 + j;
      v[j] = s < splits ? *reinterpret_cast<const Vec*>(p.part_o + prow(s) * D + lane * kPerLane)
                        : Vec{};
    }
  };
  load_batch(0);
  float lse[kMaxSplits / 32];
#pragma unroll
  for (int k = 0; k < kMaxSplits / 32; ++k) {
    const int s = lane + 32 * k;
    lse[k] = s < splits ? p.part_lse[prow(s)] : -INFINITY;
  }
  float mx = fmaxf(lse[0], lse[1]);
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
  float wgt[kMaxSplits / 32], wsum = 0.f;
#pragma unroll
  for (int k = 0; k < kMaxSplits / 32; ++k) {
    wgt[k] = mx == -INFINITY ? 0.f : Exp2(lse[k] - mx);
    wsum += wgt[k];
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) wsum += __shfl_xor_sync(0xffffffffu, wsum, off);
  float acc[kPerLane] = {};
  for (int s0 = 0;;) {
#pragma unroll
    for (int j = 0; j < kMergeBatch; ++j) {
      const int s = s0 + j;
      const float w = __shfl_sync(0xffffffffu, (s & 32) ? wgt[1] : wgt[0], s & 31);
      // A split with weight 0 (no visible key, or past `splits`) adds nothing, whatever its row
      // holds: selected away rather than multiplied, as 0 x NaN would not vanish.
      if (s < splits && w != 0.f) {
        const float* x = reinterpret_cast<const float*>(&v[j]);
#pragma unroll
        for (int k = 0; k < kPerLane; ++k) acc[k] += w * x[k];
      }
    }
    s0 += kMergeBatch;
    if (s0 >= splits) break;
    load_batch(s0);
  }
  const float inv = wsum > 0.f ? 1.f / wsum : 0.f;
  const int tok = row / p.group, h = row - tok * p.group;
  __nv_bfloat16* dst =
      p.out + (static_cast<int64_t>(q_start + m_tok0 + tok) * p.num_heads + kvh * p.group + h) * D +
      lane * kPerLane;
#pragma unroll
  for (int k = 0; k < kPerLane; k += 2) {
    *reinterpret_cast<uint32_t*>(dst + k) = PackBf16(acc[k] * inv, acc[k + 1] * inv);
  }
}

// The attention kernel (`kernel`: kWgmmaWs, the sm_90a one, only for the instances it covers;
// the caller resolved the fallback), then the merge of the split-KV partials when the plan
// splits.
template <int D, PrefillRotation kRot>
absl::Status Launch(const PagedPrefillPlan& plan, const Params& params, PrefillKernel kernel,
                    int variant, cudaStream_t stream) {
  const int kv_heads = plan.shape().num_kv_heads;
  if (plan.num_work_items() > 0) {
    constexpr bool kWgmmaCovers = D == 128 && kRot != PrefillRotation::kRotateK;
    if (kWgmmaCovers && kernel == PrefillKernel::kWgmmaWs) {
      RETURN_IF_ERROR(
          prefill_internal::LaunchWgmmaWsAttention(plan, params, kRot, variant, stream));
    } else {
      RETURN_IF_ERROR((LaunchMmaSync<D, kRot>(plan, params, stream)));
    }
  }
  if (plan.num_split_groups() > 0) {
    RETURN_IF_CUDA_ERROR(LaunchOverlapped(
        PagedPrefillCombineKernel<D>,
        dim3(plan.num_split_groups(), kv_heads, kBlockM / (kThreads / 32)), dim3(kThreads), 0,
        stream, params));
  }
  return absl::OkStatus();
}

template <int D>
absl::Status DispatchRotation(const PagedPrefillPlan& plan, const Params& params,
                              PrefillRotation rotation, PrefillKernel kernel, int variant,
                              cudaStream_t stream) {
  switch (rotation) {
    case PrefillRotation::kRotateQ:
      return Launch<D, PrefillRotation::kRotateQ>(plan, params, kernel, variant, stream);
    case PrefillRotation::kRotateK:
      return Launch<D, PrefillRotation::kRotateK>(plan, params, kernel, variant, stream);
    case PrefillRotation::kNone:
      return Launch<D, PrefillRotation::kNone>(plan, params, kernel, variant, stream);
  }
  return absl::InvalidArgumentError("unknown PrefillRotation");
}

}  // namespace

bool PrefillWgmmaSupports(int head_dim, PrefillRotation rotation) {
  return head_dim == 128 &&
         (rotation == PrefillRotation::kRotateQ || rotation == PrefillRotation::kNone);
}

int PrefillCtasPerSm(PrefillKernel kernel, int head_dim, PrefillRotation rotation) {
  return kernel == PrefillKernel::kWgmmaWs && PrefillWgmmaSupports(head_dim, rotation)
             ? prefill_internal::kWgmmaCtasPerSm
             : prefill_internal::kMmaSyncCtasPerSm;
}

absl::Status PagedPrefillAttention(const PagedPrefillPlan& plan, const PagedPrefillArgs& args,
                                   PrefillRotation rotation, cudaStream_t stream) {
  if (plan.num_work_items() == 0) return absl::OkStatus();
  if (args.q == nullptr || args.k_pool == nullptr || args.v_pool == nullptr ||
      args.out == nullptr || args.device_metadata == nullptr) {
    return absl::InvalidArgumentError("paged prefill: missing tensor or metadata pointer");
  }
  if (rotation != PrefillRotation::kNone &&
      (args.rope_cos == nullptr || args.rope_sin == nullptr)) {
    return absl::InvalidArgumentError("paged prefill: rotation needs the cos/sin tables");
  }
  if (plan.workspace_bytes() > 0 && args.workspace == nullptr) {
    return absl::InvalidArgumentError("paged prefill: the plan splits KV and needs a workspace");
  }
  const PagedPrefillShape& shape = plan.shape();
  const int* meta = static_cast<const int*>(args.device_metadata);
  const PagedPrefillPlan::Layout& layout = plan.layout();
  Params params;
  params.q = args.q;
  params.k_pool = args.k_pool;
  params.v_pool = args.v_pool;
  params.out = args.out;
  params.rope_cos = args.rope_cos;
  params.rope_sin = args.rope_sin;
  params.seqs = meta + layout.seqs;
  params.entries = reinterpret_cast<const int4*>(meta + layout.entries);
  params.breaks = meta + layout.breaks;
  params.work = meta + layout.work;
  params.combine = meta + layout.combine;
  float* ws = static_cast<float*>(args.workspace);
  const int64_t part_rows =
      static_cast<int64_t>(plan.num_partials()) * shape.num_kv_heads * kBlockM;
  params.part_o = ws;
  params.part_lse = ws == nullptr ? nullptr : ws + part_rows * shape.head_dim;
  params.block_stride = static_cast<int64_t>(shape.num_kv_heads) * kKvBlock * shape.head_dim;
  params.num_heads = shape.num_heads;
  params.num_kv_heads = shape.num_kv_heads;
  params.group = shape.num_heads / shape.num_kv_heads;
  params.scale_log2 = args.scale * 1.4426950408889634f;
  if (args.kernel == PrefillKernel::kWgmmaWs &&
      (args.variant < 0 || args.variant >= PrefillWgmmaWsVariants())) {
    return absl::InvalidArgumentError(absl::StrCat("paged prefill: variant ", args.variant,
                                                   " out of range for wgmma-ws (0..",
                                                   PrefillWgmmaWsVariants() - 1, ")"));
  }
  const PrefillKernel kernel =
      args.kernel != PrefillKernel::kMmaSync && PrefillWgmmaSupports(shape.head_dim, rotation)
          ? args.kernel
          : PrefillKernel::kMmaSync;
  switch (shape.head_dim) {
    case 64:
      return DispatchRotation<64>(plan, params, rotation, kernel, args.variant, stream);
    case 128:
      return DispatchRotation<128>(plan, params, rotation, kernel, args.variant, stream);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("paged prefill: head_dim ", shape.head_dim, " unsupported"));
}

}  // namespace lazyattn
