// Paged decode attention's host side (paged_decode_attention.h): argument checks, the split
// workspace, the split plan and the launch. The kernel is paged_decode_kernel.cu.
#include "kernels/cuda/paged_decode_attention.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <memory>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_info.h"
#include "kernels/cuda/launch_overlap.cuh"
#include "kernels/cuda/paged_decode_internal.cuh"

namespace lazyattn {
namespace {

using decode_internal::KernelInfo;
using decode_internal::KernelParams;
using decode_internal::kMaxHeadDim;
using decode_internal::kMaxSplits;
using decode_internal::kMinBlocksPerSplit;
using decode_internal::kRowsPerTile;
using decode_internal::kThreads;
using decode_internal::SelectKernel;

absl::Status Validate(const PagedDecodeArgs& a) {
  if (a.head_dim != 64 && a.head_dim != 128) {
    return absl::InvalidArgumentError(
        absl::StrCat("decode attention: head_dim ", a.head_dim, " unsupported (64 or 128)"));
  }
  if (a.batch < 0 || a.batch > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("decode attention: batch ", a.batch));
  }
  if (a.num_kv_heads <= 0 || a.num_heads <= 0 || a.num_heads % a.num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("decode attention: num_heads ", a.num_heads,
                                                   " is not a multiple of num_kv_heads ",
                                                   a.num_kv_heads));
  }
  const int64_t tiles = (a.num_heads / a.num_kv_heads + kRowsPerTile - 1) / kRowsPerTile;
  if (a.num_kv_heads * tiles > 65535) {
    return absl::InvalidArgumentError("decode attention: too many heads");
  }
  if (a.max_blocks_per_seq < 0) {
    return absl::InvalidArgumentError("decode attention: max_blocks_per_seq < 0");
  }
  if (a.batch > 0 && (a.q == nullptr || a.k_pool == nullptr || a.v_pool == nullptr ||
                      a.block_tables == nullptr || a.num_blocks == nullptr || a.out == nullptr)) {
    return absl::InvalidArgumentError("decode attention: a required pointer is null");
  }
  if (a.rotate) {
    if (a.rope.head_dim != a.head_dim) {
      return absl::InvalidArgumentError(absl::StrCat("decode attention: RoPE table head_dim ",
                                                     a.rope.head_dim, " != ", a.head_dim));
    }
    if (a.rope.cos == nullptr || a.rope.sin == nullptr || a.rope.max_positions <= 0) {
      return absl::InvalidArgumentError("decode attention: rotate needs a RoPE table");
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<PagedDecodeWorkspace>> PagedDecodeWorkspace::Create(int device) {
  auto info = QueryDevice(device);
  if (!info.ok()) return info.status();
  std::unique_ptr<PagedDecodeWorkspace> w(new PagedDecodeWorkspace());
  w->sm_count_ = info->sm_count;
  // Splitting is used only while the grid has fewer CTAs than two full waves of the most
  // resident configuration (4 CTAs/SM at head_dim 64).
  w->partial_capacity_ = int64_t{2} * 4 * info->sm_count;
  w->counter_capacity_ = w->partial_capacity_;
  const size_t out_bytes = size_t(w->partial_capacity_) * kRowsPerTile * kMaxHeadDim * 4;
  const size_t lse_bytes = size_t(w->partial_capacity_) * kRowsPerTile * 4;
  const size_t cnt_bytes = size_t(w->counter_capacity_) * 4;
  RETURN_IF_CUDA_ERROR(cudaSetDevice(device));
  RETURN_IF_CUDA_ERROR(cudaMalloc(&w->memory_, out_bytes + lse_bytes + cnt_bytes));
  char* base = static_cast<char*>(w->memory_);
  w->partial_out_ = reinterpret_cast<float*>(base);
  w->partial_lse_ = reinterpret_cast<float*>(base + out_bytes);
  w->counters_ = reinterpret_cast<int32_t*>(base + out_bytes + lse_bytes);
  RETURN_IF_CUDA_ERROR(cudaMemset(w->counters_, 0, cnt_bytes));
  return w;
}

PagedDecodeWorkspace::~PagedDecodeWorkspace() {
  if (memory_ != nullptr) cudaFree(memory_);
}

absl::StatusOr<DecodePlan> PlanPagedDecode(const PagedDecodeArgs& a,
                                           const PagedDecodeWorkspace& ws) {
  if (absl::Status s = Validate(a); !s.ok()) return s;
  const KernelInfo& k = SelectKernel(a.head_dim, a.rotate);
  RETURN_IF_CUDA_ERROR(k.error);
  DecodePlan plan;
  plan.ctas_per_sm = k.ctas_per_sm;
  const int max_blocks = std::max(1, a.max_blocks_per_seq);
  const int64_t tiles = (a.num_heads / a.num_kv_heads + kRowsPerTile - 1) / kRowsPerTile;
  const int64_t groups = int64_t(std::max(a.batch, 1)) * a.num_kv_heads * tiles;
  int64_t splits = 1;
  if (a.num_splits > 1) {
    splits = a.num_splits;
  } else if (a.num_splits == 0) {
    // About one CTA per SM, while each warp keeps at least one block. Measured on the H200
    // (docs/kernels.md): at B=1, 16 splits (128 CTAs) beat 32 (one per resident slot) by 6-16%
    // from 4K to 32K tokens, and at B=8, 2 splits matched or beat 4: the per-CTA prologue,
    // epilogue and merge cost more than a second resident CTA per SM gains.
    const int64_t slots = ws.sm_count();
    if (groups < slots) splits = slots / groups;
  }
  splits = std::min<int64_t>(splits, (max_blocks + kMinBlocksPerSplit - 1) / kMinBlocksPerSplit);
  splits = std::min<int64_t>(splits, kMaxSplits);
  splits = std::min<int64_t>(splits, std::min(ws.partial_capacity(), ws.counter_capacity()) /
                                         groups);
  splits = std::max<int64_t>(splits, 1);
  plan.blocks_per_split = int((max_blocks + splits - 1) / splits);
  plan.num_splits = (max_blocks + plan.blocks_per_split - 1) / plan.blocks_per_split;
  return plan;
}

absl::Status PagedDecodeAttention(const PagedDecodeArgs& a, PagedDecodeWorkspace& ws,
                                  cudaStream_t stream) {
  auto plan = PlanPagedDecode(a, ws);
  if (!plan.ok()) return plan.status();
  if (a.batch == 0) return absl::OkStatus();
  const KernelInfo& k = SelectKernel(a.head_dim, a.rotate);
  KernelParams p;
  p.q = a.q;
  p.k_pool = a.k_pool;
  p.v_pool = a.v_pool;
  p.tables = a.block_tables;
  p.num_blocks = a.num_blocks;
  p.out = a.out;
  p.partial_out = ws.partial_out();
  p.partial_lse = ws.partial_lse();
  p.counters = ws.counters();
  p.rope_cos = a.rope.cos;
  p.rope_sin = a.rope.sin;
  p.rope_max_positions = a.rope.max_positions;
  p.num_heads = a.num_heads;
  p.num_kv_heads = a.num_kv_heads;
  p.group = a.num_heads / a.num_kv_heads;
  p.head_tiles = (p.group + kRowsPerTile - 1) / kRowsPerTile;
  p.max_blocks = a.max_blocks_per_seq;
  p.blocks_per_split = plan->blocks_per_split;
  p.num_splits = plan->num_splits;
  p.scale_log2 = a.scale * 1.4426950408889634f;
  p.out_fp32 = a.out_type == DecodeOutputType::kFp32;
  p.early_kv_loads = a.early_kv_loads;
  const dim3 grid(plan->num_splits, a.num_kv_heads * p.head_tiles, a.batch);
  RETURN_IF_CUDA_ERROR(LaunchOverlapped(k.fn, grid, dim3(kThreads), k.smem_bytes, stream, p));
  return absl::OkStatus();
}

}  // namespace lazyattn
