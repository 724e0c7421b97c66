#include "kernels/cuda/rms_norm.h"

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_check.h"

namespace lazyattn {
namespace {

constexpr int kThreads = 256;

__device__ float BlockSum(float v) {
  __shared__ float partial[kThreads / 32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = v;
  __syncthreads();
  float total = 0.f;
#pragma unroll
  for (int w = 0; w < kThreads / 32; ++w) total += partial[w];
  return total;
}

// One CTA per row. Each thread owns the same elements in both passes, so out may alias x (and
// the fused form re-reads only what it wrote itself).
template <bool kFused>
__global__ void __launch_bounds__(kThreads)
    RmsNormKernel(const __nv_bfloat16* x, __nv_bfloat16* residual, const __nv_bfloat16* weight,
                  int dim, float eps, __nv_bfloat16* out) {
  const int64_t base = int64_t(blockIdx.x) * dim;
  const __nv_bfloat16* src = kFused ? residual + base : x + base;
  float sum_sq = 0.f;
  for (int i = threadIdx.x; i < dim; i += kThreads) {
    float v;
    if (kFused) {
      const __nv_bfloat16 z =
          __float2bfloat16_rn(__bfloat162float(residual[base + i]) + __bfloat162float(x[base + i]));
      residual[base + i] = z;
      v = __bfloat162float(z);
    } else {
      v = __bfloat162float(src[i]);
    }
    sum_sq += v * v;
  }
  const float inv = rsqrtf(BlockSum(sum_sq) / dim + eps);
  for (int i = threadIdx.x; i < dim; i += kThreads) {
    out[base + i] =
        __float2bfloat16_rn(__bfloat162float(src[i]) * inv * __bfloat162float(weight[i]));
  }
}

__global__ void __launch_bounds__(kThreads)
    RmsNormF32Kernel(const float* x, const __nv_bfloat16* weight, int dim, float eps,
                     __nv_bfloat16* out) {
  const int64_t base = int64_t(blockIdx.x) * dim;
  float sum_sq = 0.f;
  for (int i = threadIdx.x; i < dim; i += kThreads) sum_sq += x[base + i] * x[base + i];
  const float inv = rsqrtf(BlockSum(sum_sq) / dim + eps);
  for (int i = threadIdx.x; i < dim; i += kThreads) {
    out[base + i] = __float2bfloat16_rn(x[base + i] * inv * __bfloat162float(weight[i]));
  }
}

absl::Status Check(int64_t rows, int dim) {
  if (rows < 0 || rows > 0x7fffffff || dim <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("rms norm: rows ", rows, ", dim ", dim));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RmsNormCuda(const __nv_bfloat16* x, const __nv_bfloat16* weight, int64_t rows,
                         int dim, float eps, __nv_bfloat16* out, cudaStream_t stream) {
  if (absl::Status s = Check(rows, dim); !s.ok()) return s;
  if (rows == 0) return absl::OkStatus();
  RmsNormKernel<false><<<rows, kThreads, 0, stream>>>(x, nullptr, weight, dim, eps, out);
  RETURN_IF_CUDA_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

absl::Status FusedAddRmsNormCuda(const __nv_bfloat16* x, __nv_bfloat16* residual,
                                 const __nv_bfloat16* weight, int64_t rows, int dim, float eps,
                                 __nv_bfloat16* out, cudaStream_t stream) {
  if (absl::Status s = Check(rows, dim); !s.ok()) return s;
  if (rows == 0) return absl::OkStatus();
  if (out == residual) return absl::InvalidArgumentError("fused add+rms norm: out aliases residual");
  RmsNormKernel<true><<<rows, kThreads, 0, stream>>>(x, residual, weight, dim, eps, out);
  RETURN_IF_CUDA_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

absl::Status RmsNormF32ToBf16Cuda(const float* x, const __nv_bfloat16* weight, int64_t rows,
                                  int dim, float eps, __nv_bfloat16* out, cudaStream_t stream) {
  if (absl::Status s = Check(rows, dim); !s.ok()) return s;
  if (rows == 0) return absl::OkStatus();
  RmsNormF32Kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(x, weight, dim, eps, out);
  RETURN_IF_CUDA_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace lazyattn
