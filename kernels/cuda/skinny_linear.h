// Linear layers for one row (decode at batch 1): y = x W^T streamed by CUDA cores.
//
// Same convention as CublasLtGemm::Linear (kernels/cuda/gemm.h): W row-major [out][in] bf16,
// x [1][in] bf16, y [1][out] fp32 or bf16, fp32 accumulation. One row makes the product a pass
// over the weights. One warp per output feature, 8 16-byte loads per lane at 4 CTAs per SM or
// 4 at 6 CTAs per SM (the latter where only it fits the grid in one wave, e.g. the 4096 x 6144
// qkv projection of an 8B layer), issued in two halves so one half is in flight while the other
// is consumed. The kernel is launched overlapped (kernels/cuda/launch_overlap.cuh): it issues
// its first weight loads while the previous kernel finishes, then waits for it before reading
// x or y.
// Measured against cuBLASLt on the H200 in docs/benchmarks.md; at 2-4 rows it was slower than
// cuBLASLt on every product of that shape, so it takes one row only.
//
// CPU twins: LinearCpu (kernels/include/gemm.h), and SwiGluCpu after it for the fused form.
#ifndef LAZYATTN_KERNELS_CUDA_SKINNY_LINEAR_H_
#define LAZYATTN_KERNELS_CUDA_SKINNY_LINEAR_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/gemm.h"

namespace lazyattn {

// Whether SkinnyLinearCuda takes this product: one row, `in` a multiple of 8, x and w 16-byte
// aligned, `out` within 32-bit range.
bool SkinnyLinearSupports(int64_t rows, int64_t in, int64_t out, const void* x, const void* w);

// y = x W^T (+ y when accumulate). InvalidArgument where SkinnyLinearSupports is false.
absl::Status SkinnyLinearCuda(const __nv_bfloat16* x, const __nv_bfloat16* w, int64_t rows,
                              int64_t in, int64_t out, void* y, GemmOutputType y_type,
                              bool accumulate, cudaStream_t stream);

// The Llama MLP's first half in one pass: act[i] = silu(x . w[i]) * (x . w[inter + i]) for
// w_gate_up [2 * inter][in] (gate rows, then up rows), act bf16 [1][inter]. Gate and up stay
// fp32 up to the product (SwiGluCuda reads them rounded to bf16), and the [2 * inter] gate/up
// row is never written.
absl::Status SkinnyLinearSwiGluCuda(const __nv_bfloat16* x, const __nv_bfloat16* w_gate_up,
                                    int64_t rows, int64_t in, int64_t inter,
                                    __nv_bfloat16* act, cudaStream_t stream);

// The same products with the layer's RMSNorm in front, for an fp32 residual row x:
//   h = bf16(x / sqrt(mean(x^2) + eps) * norm_weight),  then y = h W^T (+ y) / the SwiGLU form.
// h equals RmsNormF32ToBf16Cuda's output bit for bit (kernels/cuda/rms_norm_row.cuh), so the
// results equal that kernel followed by SkinnyLinearCuda / SkinnyLinearSwiGluCuda exactly. Each
// CTA normalizes the row itself into shared memory (it reads x and the norm weight from L2),
// which spares a decode step at batch 1 the norm's own launch: two a layer. x may be the y of
// the previous kernel on the stream (read after the overlapped launch's wait), not this one's.
// One row; in <= kMaxNormedIn (the row fits the default 48 KB of shared memory).
inline constexpr int64_t kMaxNormedIn = 24576;
bool SkinnyRmsNormLinearSupports(int64_t in, int64_t out, const float* x, const void* w);
absl::Status SkinnyRmsNormLinearCuda(const float* x, const __nv_bfloat16* norm_weight, float eps,
                                     const __nv_bfloat16* w, int64_t in, int64_t out, void* y,
                                     GemmOutputType y_type, bool accumulate, cudaStream_t stream);
absl::Status SkinnyRmsNormLinearSwiGluCuda(const float* x, const __nv_bfloat16* norm_weight,
                                           float eps, const __nv_bfloat16* w_gate_up, int64_t in,
                                           int64_t inter, __nv_bfloat16* act,
                                           cudaStream_t stream);

}  // namespace lazyattn

#endif  // LAZYATTN_KERNELS_CUDA_SKINNY_LINEAR_H_
