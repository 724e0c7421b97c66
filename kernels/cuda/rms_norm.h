// RMSNorm on bf16 rows (CUDA), optionally fused with the residual add that precedes it.
// CPU twin: RmsNormCpu (kernels/include/rms_norm.h). fp32 arithmetic, bf16 storage.
#ifndef LAZYATTN_KERNELS_CUDA_RMS_NORM_H_
#define LAZYATTN_KERNELS_CUDA_RMS_NORM_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace lazyattn {

// out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight. x, out: [rows][dim] (may alias).
absl::Status RmsNormCuda(const __nv_bfloat16* x, const __nv_bfloat16* weight, int64_t rows,
                         int dim, float eps, __nv_bfloat16* out, cudaStream_t stream);

// The pre-norm residual step of a transformer layer, in one pass:
//   residual[r] = bf16(residual[r] + x[r]);  out[r] = RmsNorm(residual[r]) * weight
// (the norm reads the rounded sum, so out == RmsNormCuda(residual) exactly as stored).
// out may alias x, not residual.
absl::Status FusedAddRmsNormCuda(const __nv_bfloat16* x, __nv_bfloat16* residual,
                                 const __nv_bfloat16* weight, int64_t rows, int dim, float eps,
                                 __nv_bfloat16* out, cudaStream_t stream);

// RMSNorm of an fp32 residual stream into bf16: out[r] = bf16(x[r] / sqrt(mean(x[r]^2) + eps) *
// weight). Keeping the residual in fp32 (only GEMM inputs are bf16) stops models with large
// activation outliers from losing their small channels to bf16 rounding at every residual add.
absl::Status RmsNormF32ToBf16Cuda(const float* x, const __nv_bfloat16* weight, int64_t rows,
                                  int dim, float eps, __nv_bfloat16* out, cudaStream_t stream);

// The fp32 residual step and the next norm in one pass:
//   residual[r] += delta[r] (fp32, stored);  out[r] = bf16(RmsNorm(residual[r]) * weight).
// The layer's output projections then write plain fp32 products instead of adding into the
// residual inside the GEMM (inside a batch-1 decode step on the H200, cuBLASLt's accumulating
// kernel for the 4096 x 4096 o projection took 26 us, the plain one for the larger qkv
// projection 16.5 us). delta must not alias residual.
absl::Status AddRmsNormF32ToBf16Cuda(float* residual, const float* delta,
                                     const __nv_bfloat16* weight, int64_t rows, int dim, float eps,
                                     __nv_bfloat16* out, cudaStream_t stream);

}  // namespace lazyattn

#endif  // LAZYATTN_KERNELS_CUDA_RMS_NORM_H_
