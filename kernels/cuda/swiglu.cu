#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch_overlap.cuh"
#include "kernels/cuda/swiglu.h"

namespace lazyattn {
namespace {

// The one expression every path rounds, so the vector and scalar forms give the same bits (and
// the wgmma product's fused form, which rounds gate and up to bf16 first, matches them).
__device__ __forceinline__ float SiluTimes(float g, float u) { return g / (1.f + expf(-g)) * u; }

// kVec consecutive values a thread: 8 when every row starts 16-byte aligned (one 16-byte load of
// gate, one of up, one store), else 1. A prefill chunk reads 2 x 8,192 x 14,336 bf16 values and
// writes half that; the one-value form moved them at 1.8 TB/s on an H200 (385 us a layer), so
// the product's step spent 6 % of its time here.
template <int kVec>
__global__ void SwiGluKernel(const __nv_bfloat16* gate_up, int64_t rows, int64_t dim,
                             __nv_bfloat16* out) {
  // Launched overlapped: wait, then let the next kernel launch (launch_overlap.cuh).
  WaitForPrerequisiteGrid();
  AllowDependentLaunch();
  const int64_t per_row = dim / kVec, n = rows * per_row;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / per_row, c = (i - r * per_row) * kVec;
    const __nv_bfloat16* g = gate_up + r * 2 * dim + c;
    __nv_bfloat16* o = out + r * dim + c;
    if constexpr (kVec == 8) {
      const uint4 gv = __ldcs(reinterpret_cast<const uint4*>(g));
      const uint4 uv = __ldcs(reinterpret_cast<const uint4*>(g + dim));
      const auto* g2 = reinterpret_cast<const __nv_bfloat162*>(&gv);
      const auto* u2 = reinterpret_cast<const __nv_bfloat162*>(&uv);
      uint4 ov;
      auto* o2 = reinterpret_cast<__nv_bfloat162*>(&ov);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float2 gf = __bfloat1622float2(g2[k]), uf = __bfloat1622float2(u2[k]);
        o2[k] = __halves2bfloat162(__float2bfloat16_rn(SiluTimes(gf.x, uf.x)),
                                   __float2bfloat16_rn(SiluTimes(gf.y, uf.y)));
      }
      *reinterpret_cast<uint4*>(o) = ov;
    } else {
      *o = __float2bfloat16_rn(SiluTimes(__bfloat162float(*g), __bfloat162float(g[dim])));
    }
  }
}

}  // namespace

absl::Status SwiGluCuda(const __nv_bfloat16* gate_up, int64_t rows, int64_t dim, __nv_bfloat16* out,
                        cudaStream_t stream) {
  if (rows < 0 || dim <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("swiglu: rows ", rows, ", dim ", dim));
  }
  if (rows == 0) return absl::OkStatus();
  const bool vec = dim % 8 == 0 && reinterpret_cast<uintptr_t>(gate_up) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(out) % 16 == 0;
  const int64_t n = rows * (vec ? dim / 8 : dim);
  const int threads = 256;
  const auto blocks = static_cast<unsigned>(std::min<int64_t>((n + threads - 1) / threads, 65536));
  RETURN_IF_CUDA_ERROR(vec ? LaunchOverlapped(SwiGluKernel<8>, dim3(blocks), dim3(threads), 0,
                                              stream, gate_up, rows, dim, out)
                           : LaunchOverlapped(SwiGluKernel<1>, dim3(blocks), dim3(threads), 0,
                                              stream, gate_up, rows, dim, out));
  return absl::OkStatus();
}

}  // namespace lazyattn
