#include "services/worker/cuda/weight_fill.h"

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_check.h"

namespace lazyattn {
namespace {

// SplitMix64's finaliser: a good 64-bit mix, cheap enough to call per element.
__device__ __forceinline__ uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

__global__ void FillNormalKernel(__nv_bfloat16* out, int64_t n, uint64_t key, float mean,
                                 float stddev) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const uint64_t bits = Mix64(key ^ Mix64(static_cast<uint64_t>(i)));
    // Two 24-bit uniforms in (0, 1]; Box-Muller's cosine branch.
    const float u1 = (static_cast<float>(bits >> 40) + 1.0f) * (1.0f / 16777216.0f);
    const float u2 = static_cast<float>((bits >> 8) & 0xFFFFFF) * (1.0f / 16777216.0f);
    const float z = sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
    out[i] = __float2bfloat16_rn(mean + stddev * z);
  }
}

__global__ void ConvertKernel(const float* in, int64_t n, __nv_bfloat16* out) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    out[i] = __float2bfloat16_rn(in[i]);
  }
}

int GridFor(int64_t n) {
  const int64_t blocks = (n + 255) / 256;
  return static_cast<int>(blocks < 65536 ? blocks : 65536);
}

}  // namespace

absl::Status FillNormalBf16(__nv_bfloat16* out, int64_t n, uint64_t seed, uint64_t stream_id,
                            float mean, float stddev, cudaStream_t stream) {
  if (n < 0 || (n > 0 && out == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat("random fill: n ", n));
  }
  if (n == 0) return absl::OkStatus();
  const uint64_t key = seed * 0x9e3779b97f4a7c15ull + stream_id * 0xd1b54a32d192ed03ull;
  FillNormalKernel<<<GridFor(n), 256, 0, stream>>>(out, n, key, mean, stddev);
  RETURN_IF_CUDA_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

absl::Status ConvertF32ToBf16(const float* in, int64_t n, __nv_bfloat16* out,
                              cudaStream_t stream) {
  if (n < 0 || (n > 0 && (in == nullptr || out == nullptr))) {
    return absl::InvalidArgumentError(absl::StrCat("bf16 conversion: n ", n));
  }
  if (n == 0) return absl::OkStatus();
  ConvertKernel<<<GridFor(n), 256, 0, stream>>>(in, n, out);
  RETURN_IF_CUDA_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace lazyattn
