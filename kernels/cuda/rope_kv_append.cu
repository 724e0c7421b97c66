#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch_overlap.cuh"
#include "kernels/cuda/rope_kv_append.h"

namespace lazyattn {
namespace {

constexpr int kBlockSize = 16;

constexpr int kThreads = 256;

// Grid: x = token, y = a slice of kThreads work items of that token. An item is kPairs rotation
// pairs of a q or k head (frequencies f..f + kPairs - 1 and the same + head_dim / 2) or one
// 8-value (16-byte) piece of a v head (single values when head_dim % 8 != 0). kPairs is 8 where
// every q, k and table row starts 16-byte aligned (16-byte loads and stores, two float4 of cos
// and of sin), else 1: a prefill chunk of 8,192 tokens moves 200 MB here, which the one-pair form
// did at 1.3 TB/s on an H200 (158 us a layer). One item per thread and no loop: a one-token
// decode step then costs about one memory round trip (positions, then cos/sin and the inputs),
// instead of one per loop iteration of a single CTA. Every pair is rotated by the same
// expressions in either form, so both give the same bits.
template <int kPairs>
__global__ void __launch_bounds__(kThreads) RopeKvAppendKernel(const RopeKvAppendArgs a) {
  // Launched overlapped: wait, then let the next kernel launch (launch_overlap.cuh).
  WaitForPrerequisiteGrid();
  AllowDependentLaunch();
  const int t = blockIdx.x;
  const int item = blockIdx.y * kThreads + threadIdx.x;
  const int half = a.head_dim / 2;
  const int q_items = a.num_heads * half / kPairs, k_items = a.num_kv_heads * half / kPairs;
  const int v_piece = a.head_dim % 8 == 0 ? 8 : 1;
  const int v_items = a.num_kv_heads * a.head_dim / v_piece;
  if (item >= q_items + k_items + v_items) return;
  const int64_t slot = a.slots[t];
  const int64_t block = slot >= 0 ? slot / kBlockSize : 0;
  const int offset = slot >= 0 ? int(slot % kBlockSize) : 0;

  if (item >= q_items + k_items) {  // v: a plain copy into the pool
    if (slot < 0) return;
    const int i = (item - q_items - k_items) * v_piece;
    const int h = i / a.head_dim, x = i % a.head_dim;
    __nv_bfloat16* dst =
        a.v_pool + ((block * a.num_kv_heads + h) * kBlockSize + offset) * a.head_dim + x;
    const __nv_bfloat16* src = a.v + t * a.v_row_stride + i;
    if (v_piece == 8) {
      *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
    } else {
      *dst = *src;
    }
    return;
  }
  const bool is_q = item < q_items;
  if (!is_q && slot < 0) return;
  const int j = (is_q ? item : item - q_items) * kPairs;  // half % kPairs == 0: one head
  const int h = j / half, f = j % half;
  const int64_t local = a.local_positions[t];
  const int64_t last = a.rope.max_positions - 1;
  const int64_t pos = is_q ? min(local + a.deltas[t], last) : min(local, last);
  const float* cos_row = a.rope.cos + pos * half + f;
  const float* sin_row = a.rope.sin + pos * half + f;
  const __nv_bfloat16* src =
      is_q ? a.q + t * a.q_row_stride + h * a.head_dim : a.k + t * a.k_row_stride + h * a.head_dim;
  __nv_bfloat16* dst =
      is_q ? a.q_out + (int64_t(t) * a.num_heads + h) * a.head_dim
           : a.k_pool + ((block * a.num_kv_heads + h) * kBlockSize + offset) * a.head_dim;
  // x1 * c - x2 * s and x1 * s + x2 * c, rounded once each.
  const auto rotate = [](float x1, float x2, float c, float s, __nv_bfloat16& y1,
                         __nv_bfloat16& y2) {
    y1 = __float2bfloat16_rn(x1 * c - x2 * s);
    y2 = __float2bfloat16_rn(x1 * s + x2 * c);
  };
  if constexpr (kPairs == 8) {
    const uint4 lo = *reinterpret_cast<const uint4*>(src + f);
    const uint4 hi = *reinterpret_cast<const uint4*>(src + f + half);
    float c[8], s[8];
    *reinterpret_cast<float4*>(c) = *reinterpret_cast<const float4*>(cos_row);
    *reinterpret_cast<float4*>(c + 4) = *reinterpret_cast<const float4*>(cos_row + 4);
    *reinterpret_cast<float4*>(s) = *reinterpret_cast<const float4*>(sin_row);
    *reinterpret_cast<float4*>(s + 4) = *reinterpret_cast<const float4*>(sin_row + 4);
    const auto* x1 = reinterpret_cast<const __nv_bfloat16*>(&lo);
    const auto* x2 = reinterpret_cast<const __nv_bfloat16*>(&hi);
    uint4 out_lo, out_hi;
    auto* y1 = reinterpret_cast<__nv_bfloat16*>(&out_lo);
    auto* y2 = reinterpret_cast<__nv_bfloat16*>(&out_hi);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      rotate(__bfloat162float(x1[k]), __bfloat162float(x2[k]), c[k], s[k], y1[k], y2[k]);
    }
    *reinterpret_cast<uint4*>(dst + f) = out_lo;
    *reinterpret_cast<uint4*>(dst + f + half) = out_hi;
  } else {
    rotate(__bfloat162float(src[f]), __bfloat162float(src[f + half]), *cos_row, *sin_row, dst[f],
           dst[f + half]);
  }
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

absl::Status RopeKvAppend(const RopeKvAppendArgs& a, cudaStream_t stream) {
  if (a.num_tokens == 0) return absl::OkStatus();
  if (a.num_tokens < 0 || a.head_dim <= 0 || a.head_dim % 2 != 0 || a.num_heads <= 0 ||
      a.num_kv_heads <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("rope/kv append: bad shape: tokens ",
                                                   a.num_tokens, ", heads ", a.num_heads, "/",
                                                   a.num_kv_heads, ", head_dim ", a.head_dim));
  }
  if (a.rope.head_dim != a.head_dim || a.rope.cos == nullptr || a.rope.max_positions <= 0) {
    return absl::InvalidArgumentError("rope/kv append: RoPE table missing or of another head_dim");
  }
  if (a.q == nullptr || a.k == nullptr || a.v == nullptr || a.q_out == nullptr ||
      a.k_pool == nullptr || a.v_pool == nullptr || a.local_positions == nullptr ||
      a.deltas == nullptr || a.slots == nullptr) {
    return absl::InvalidArgumentError("rope/kv append: a required pointer is null");
  }
  if (a.q == a.q_out && a.q_row_stride != int64_t{a.num_heads} * a.head_dim) {
    return absl::InvalidArgumentError("rope/kv append: in place needs a contiguous q");
  }
  if (a.head_dim % 8 == 0 &&
      (a.v_row_stride % 8 != 0 || reinterpret_cast<uintptr_t>(a.v) % 16 != 0 ||
       reinterpret_cast<uintptr_t>(a.v_pool) % 16 != 0)) {
    return absl::InvalidArgumentError("rope/kv append: v rows must be 16-byte aligned");
  }
  // 8 pairs a thread where every row of q, k, q_out, the pool and the table is 16-byte aligned.
  const bool vec = (a.head_dim / 2) % 8 == 0 && a.q_row_stride % 8 == 0 &&
                   a.k_row_stride % 8 == 0 && Aligned16(a.q) && Aligned16(a.k) &&
                   Aligned16(a.q_out) && Aligned16(a.k_pool) && Aligned16(a.rope.cos) &&
                   Aligned16(a.rope.sin);
  const int pairs = vec ? 8 : 1;
  const int items = (a.num_heads + a.num_kv_heads) * (a.head_dim / 2) / pairs +
                    a.num_kv_heads * a.head_dim / (a.head_dim % 8 == 0 ? 8 : 1);
  const dim3 grid(a.num_tokens, (items + kThreads - 1) / kThreads);
  RETURN_IF_CUDA_ERROR(
      vec ? LaunchOverlapped(RopeKvAppendKernel<8>, grid, dim3(kThreads), 0, stream, a)
          : LaunchOverlapped(RopeKvAppendKernel<1>, grid, dim3(kThreads), 0, stream, a));
  return absl::OkStatus();
}

}  // namespace lazyattn
