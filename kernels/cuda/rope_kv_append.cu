#include "kernels/cuda/rope_kv_append.h"

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_check.h"

namespace lazyattn {
namespace {

constexpr int kBlockSize = 16;

// One CTA per token; threads stride over (head, frequency) pairs of q and k, then over v.
__global__ void RopeKvAppendKernel(const RopeKvAppendArgs a) {
  const int t = blockIdx.x;
  const int half = a.head_dim / 2;
  const int64_t local = a.local_positions[t];
  const int64_t last = a.rope.max_positions - 1;
  const int64_t qpos = min(local + a.deltas[t], last), kpos = min(local, last);
  const int64_t slot = a.slots[t];
  const int64_t block = slot >= 0 ? slot / kBlockSize : 0;
  const int offset = slot >= 0 ? int(slot % kBlockSize) : 0;

  const int q_pairs = a.num_heads * half, k_pairs = a.num_kv_heads * half;
  for (int i = threadIdx.x; i < q_pairs + k_pairs; i += blockDim.x) {
    const bool is_q = i < q_pairs;
    const int j = is_q ? i : i - q_pairs;
    const int h = j / half, f = j % half;
    const int64_t pos = is_q ? qpos : kpos;
    const float c = a.rope.cos[pos * half + f], s = a.rope.sin[pos * half + f];
    const __nv_bfloat16* src =
        is_q ? a.q + t * a.q_row_stride + h * a.head_dim : a.k + t * a.k_row_stride + h * a.head_dim;
    const float x1 = __bfloat162float(src[f]), x2 = __bfloat162float(src[f + half]);
    const __nv_bfloat16 y1 = __float2bfloat16_rn(x1 * c - x2 * s);
    const __nv_bfloat16 y2 = __float2bfloat16_rn(x1 * s + x2 * c);
    if (is_q) {
      __nv_bfloat16* dst = a.q_out + (int64_t(t) * a.num_heads + h) * a.head_dim;
      dst[f] = y1;
      dst[f + half] = y2;
    } else if (slot >= 0) {
      __nv_bfloat16* dst =
          a.k_pool + ((block * a.num_kv_heads + h) * kBlockSize + offset) * a.head_dim;
      dst[f] = y1;
      dst[f + half] = y2;
    }
  }
  if (slot < 0) return;
  const int v_elems = a.num_kv_heads * a.head_dim;
  for (int i = threadIdx.x; i < v_elems; i += blockDim.x) {
    const int h = i / a.head_dim, x = i % a.head_dim;
    a.v_pool[((block * a.num_kv_heads + h) * kBlockSize + offset) * a.head_dim + x] =
        a.v[t * a.v_row_stride + i];
  }
}

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
  RopeKvAppendKernel<<<a.num_tokens, 256, 0, stream>>>(a);
  RETURN_IF_CUDA_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace lazyattn
