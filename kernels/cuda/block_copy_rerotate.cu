#include "kernels/cuda/block_copy_rerotate.h"

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_check.h"

namespace lazyattn {
namespace {

constexpr int kBlockSize = 16;
constexpr int kThreads = 256;

// One CTA per (copy, layer, kv head): a [16][head_dim] tile of K (rotated) and of V (copied with
// 16-byte loads).
__global__ void BlockCopyRerotateKernel(const BlockCopyRerotateArgs a) {
  const BlockCopy cp = a.copies[blockIdx.x];
  const int layer = blockIdx.y, h = blockIdx.z;
  const int d = a.head_dim, half = d / 2;
  const int64_t tile = int64_t(kBlockSize) * d;
  const int64_t src = layer * a.layer_stride + (int64_t(cp.src) * a.num_kv_heads + h) * tile;
  const int64_t dst = layer * a.layer_stride + (int64_t(cp.dst) * a.num_kv_heads + h) * tile;

  // V: 16-byte vectors when the tile is 16-byte aligned (head_dim % 8 == 0), else elements.
  if (d % 8 == 0) {
    const uint4* vs = reinterpret_cast<const uint4*>(a.v_pool + src);
    uint4* vd = reinterpret_cast<uint4*>(a.v_pool + dst);
    for (int i = threadIdx.x; i < tile / 8; i += kThreads) vd[i] = vs[i];
  } else {
    for (int i = threadIdx.x; i < tile; i += kThreads) a.v_pool[dst + i] = a.v_pool[src + i];
  }

  const int64_t pos = min(int64_t(cp.delta < 0 ? -cp.delta : cp.delta), a.rope.max_positions - 1);
  const float sign = cp.delta < 0 ? -1.f : 1.f;  // sin(-x) = -sin(x)
  for (int i = threadIdx.x; i < kBlockSize * half; i += kThreads) {
    const int slot = i / half, f = i % half;
    const float c = a.rope.cos[pos * half + f], s = sign * a.rope.sin[pos * half + f];
    const __nv_bfloat16* ks = a.k_pool + src + slot * d;
    __nv_bfloat16* kd = a.k_pool + dst + slot * d;
    const float x1 = __bfloat162float(ks[f]), x2 = __bfloat162float(ks[f + half]);
    kd[f] = __float2bfloat16_rn(x1 * c - x2 * s);
    kd[f + half] = __float2bfloat16_rn(x1 * s + x2 * c);
  }
}

}  // namespace

absl::Status BlockCopyRerotate(const BlockCopyRerotateArgs& a, cudaStream_t stream) {
  if (a.num_copies == 0 || a.num_layers == 0) return absl::OkStatus();
  if (a.num_copies < 0 || a.num_layers < 0 || a.num_layers > 65535 || a.num_kv_heads <= 0 ||
      a.num_kv_heads > 65535 || a.head_dim <= 0 || a.head_dim % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "block copy: bad shape: copies ", a.num_copies, ", layers ", a.num_layers, ", kv heads ",
        a.num_kv_heads, ", head_dim ", a.head_dim));
  }
  if (a.copies == nullptr || a.k_pool == nullptr || a.v_pool == nullptr ||
      a.rope.cos == nullptr || a.rope.head_dim != a.head_dim) {
    return absl::InvalidArgumentError("block copy: missing pointer or RoPE table of another size");
  }
  const dim3 grid(a.num_copies, a.num_layers, a.num_kv_heads);
  BlockCopyRerotateKernel<<<grid, kThreads, 0, stream>>>(a);
  RETURN_IF_CUDA_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace lazyattn
