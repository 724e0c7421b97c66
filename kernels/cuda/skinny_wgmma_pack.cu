// PackWeightsForWgmma (skinny_wgmma_linear.h): weights rewritten in the shared-memory image the
// kernel's TMA loads would produce, so the kernel can read them as contiguous blocks. Apart from
// the kernel and its host side because it runs once per model load, not per product.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/skinny_wgmma_internal.cuh"
#include "kernels/cuda/skinny_wgmma_linear.h"

namespace lazyattn {
namespace {

using skinny_wgmma_internal::kTileK;
using skinny_wgmma_internal::kTileM;

// Element (n, k) of W goes to block (n / 64, k / 64), row n % 64 of 128 bytes, 16-byte chunk
// (k % 64) / 8 XOR (n % 8): the smem image TMA's 128-byte swizzle gives a 64 x 64 box whose base
// is 1024-byte aligned. Zeros past out or in, as TMA's out-of-bounds fill.
__global__ void PackWeightsKernel(const __nv_bfloat16* __restrict__ w, int64_t out, int64_t in,
                                  int64_t k_blocks, int64_t total,
                                  __nv_bfloat16* __restrict__ packed) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t block = i / (kTileM * kTileK);
    const int within = static_cast<int>(i % (kTileM * kTileK));
    const int r = within / kTileK, slot = within % kTileK;  // slot: position in the smem row
    const int chunk = (slot / 8) ^ (r % 8), e = slot % 8;     // the chunk's source position
    const int64_t n = block / k_blocks * kTileM + r;
    const int64_t k = block % k_blocks * kTileK + chunk * 8 + e;
    packed[i] = n < out && k < in ? w[n * in + k] : __float2bfloat16_rn(0.f);
  }
}

}  // namespace

// Groups of 64 rows, padded to whole 256-row tiles: the widest tile's copies stay inside.
int64_t PackedGroups(int64_t out) { return (out + 4 * kTileM - 1) / (4 * kTileM) * 4; }

int64_t PackedWeightsElements(int64_t out, int64_t in) {
  return PackedGroups(out) * ((in + kTileK - 1) / kTileK) * kTileM * kTileK;
}

absl::Status PackWeightsForWgmma(const __nv_bfloat16* w, int64_t out, int64_t in,
                                 __nv_bfloat16* packed, cudaStream_t stream) {
  if (w == nullptr || packed == nullptr || out < 1 || in < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("pack weights for wgmma: out ", out, ", in ", in, ", pointers required"));
  }
  const int64_t blocks = std::min<int64_t>((PackedWeightsElements(out, in) + 255) / 256, 65536);
  PackWeightsKernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(
      w, out, in, (in + kTileK - 1) / kTileK, PackedWeightsElements(out, in), packed);
  RETURN_IF_CUDA_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace lazyattn
