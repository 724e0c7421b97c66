#include "kernels/cuda/swiglu.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch_overlap.cuh"

namespace lazyattn {
namespace {

__global__ void SwiGluKernel(const __nv_bfloat16* gate_up, int64_t rows, int64_t dim,
                             __nv_bfloat16* out) {
  // Launched overlapped: wait, then let the next kernel launch (launch_overlap.cuh).
  WaitForPrerequisiteGrid();
  AllowDependentLaunch();
  const int64_t n = rows * dim;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / dim, c = i % dim;
    const float g = __bfloat162float(gate_up[r * 2 * dim + c]);
    const float u = __bfloat162float(gate_up[r * 2 * dim + dim + c]);
    out[i] = __float2bfloat16_rn(g / (1.f + expf(-g)) * u);
  }
}

}  // namespace

absl::Status SwiGluCuda(const __nv_bfloat16* gate_up, int64_t rows, int64_t dim,
                        __nv_bfloat16* out, cudaStream_t stream) {
  if (rows < 0 || dim <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("swiglu: rows ", rows, ", dim ", dim));
  }
  if (rows == 0) return absl::OkStatus();
  const int64_t n = rows * dim;
  const int threads = 256;
  const int64_t blocks = std::min<int64_t>((n + threads - 1) / threads, 65536);
  RETURN_IF_CUDA_ERROR(LaunchOverlapped(SwiGluKernel, dim3(static_cast<unsigned>(blocks)),
                                        dim3(threads), 0, stream, gate_up, rows, dim, out));
  return absl::OkStatus();
}

}  // namespace lazyattn
