#include "kernels/cuda/rms_norm.h"

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch_overlap.cuh"
#include "kernels/cuda/rms_norm_row.cuh"

namespace lazyattn {
namespace {

constexpr int kThreads = kRmsNormThreads;

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
  const float inv = RmsNormInverse(RmsNormBlockSum(sum_sq), dim, eps);
  for (int i = threadIdx.x; i < dim; i += kThreads) {
    out[base + i] =
        __float2bfloat16_rn(__bfloat162float(src[i]) * inv * __bfloat162float(weight[i]));
  }
}

// fp32 rows into bf16. A decode step normalizes one row per CTA, so the kernel is one memory
// round trip long if it is written that way: every load of a row is issued before the first
// store (the pointers are __restrict__, and the row sits in registers between the two passes).
// kVecPerThread float4s per thread cover dims up to 4 * 256 * 4 = 4,096 in registers; larger
// dims re-read the rest (L1/L2 hits). Dims that are not a multiple of 4 take the scalar loop.
constexpr int kVecPerThread = 4;

// With kAdd, the residual step comes first: x[r] += delta[r] (fp32, written back), and the norm
// reads the sum. x and delta are distinct rows; each thread loads, adds and stores only its own
// elements, so the write-back cannot race.
template <bool kAdd>
__global__ void __launch_bounds__(kThreads)
    RmsNormF32Kernel(float* __restrict__ x, const float* __restrict__ delta,
                     const __nv_bfloat16* __restrict__ weight, int dim, float eps,
                     __nv_bfloat16* __restrict__ out) {
  // Launched overlapped: wait, then let the next kernel launch (launch_overlap.cuh).
  WaitForPrerequisiteGrid();
  AllowDependentLaunch();
  const int64_t base = int64_t(blockIdx.x) * dim;
  if (dim % 4 != 0) {
    float sum_sq = 0.f;
    for (int i = threadIdx.x; i < dim; i += kThreads) {
      float v = x[base + i];
      if (kAdd) {
        v += delta[base + i];
        x[base + i] = v;
      }
      sum_sq += v * v;
    }
    const float inv = RmsNormInverse(RmsNormBlockSum(sum_sq), dim, eps);
    for (int i = threadIdx.x; i < dim; i += kThreads) {
      out[base + i] = __float2bfloat16_rn(x[base + i] * inv * __bfloat162float(weight[i]));
    }
    return;
  }
  const int n4 = dim / 4;
  float4* x4 = reinterpret_cast<float4*>(x + base);
  const float4* d4 = reinterpret_cast<const float4*>(delta + base);
  auto load = [&](int i) {
    float4 t = x4[i];
    if (kAdd) {
      const float4 d = d4[i];
      t.x += d.x, t.y += d.y, t.z += d.z, t.w += d.w;
    }
    return t;
  };
  float4 v[kVecPerThread];
  float sum_sq = 0.f;
#pragma unroll
  for (int u = 0; u < kVecPerThread; ++u) {
    const int i = threadIdx.x + u * kThreads;
    v[u] = i < n4 ? load(i) : make_float4(0.f, 0.f, 0.f, 0.f);
    sum_sq += SumSquares4(v[u]);
  }
  for (int i = threadIdx.x + kVecPerThread * kThreads; i < n4; i += kThreads) {
    const float4 t = load(i);
    if (kAdd) x4[i] = t;
    sum_sq += SumSquares4(t);
  }
  if (kAdd) {
#pragma unroll
    for (int u = 0; u < kVecPerThread; ++u) {
      const int i = threadIdx.x + u * kThreads;
      if (i < n4) x4[i] = v[u];
    }
  }
  const float inv = RmsNormInverse(RmsNormBlockSum(sum_sq), dim, eps);
  auto store = [&](int i, float4 t) {
    reinterpret_cast<uint2*>(out + base)[i] =
        RmsNormScale4(t, inv, reinterpret_cast<const uint2*>(weight)[i]);
  };
#pragma unroll
  for (int u = 0; u < kVecPerThread; ++u) {
    const int i = threadIdx.x + u * kThreads;
    if (i < n4) store(i, v[u]);
  }
  // Past the register-held part: x already holds the sum (this thread wrote it above).
  for (int i = threadIdx.x + kVecPerThread * kThreads; i < n4; i += kThreads) store(i, x4[i]);
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
  // The kernel's x is writable only for the fused form, which this is not.
  RETURN_IF_CUDA_ERROR(LaunchOverlapped(RmsNormF32Kernel<false>, dim3(static_cast<unsigned>(rows)),
                                        dim3(kThreads), 0, stream, const_cast<float*>(x), nullptr,
                                        weight, dim, eps, out));
  return absl::OkStatus();
}

absl::Status AddRmsNormF32ToBf16Cuda(float* residual, const float* delta,
                                     const __nv_bfloat16* weight, int64_t rows, int dim, float eps,
                                     __nv_bfloat16* out, cudaStream_t stream) {
  if (absl::Status s = Check(rows, dim); !s.ok()) return s;
  if (rows == 0) return absl::OkStatus();
  if (residual == delta) return absl::InvalidArgumentError("add+rms norm: delta aliases residual");
  RETURN_IF_CUDA_ERROR(LaunchOverlapped(RmsNormF32Kernel<true>, dim3(static_cast<unsigned>(rows)),
                                        dim3(kThreads), 0, stream, residual, delta, weight, dim,
                                        eps, out));
  return absl::OkStatus();
}

}  // namespace lazyattn
