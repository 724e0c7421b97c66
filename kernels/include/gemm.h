// Matrix products of the linear layers over fp32 weights (CPU twin: quant_linear.h on the kernel
// threads).
//
// Weights are row-major [out_features][in_features] (the HF and GGUF layout), activations
// [rows][in_features]; y = x W^T, optionally accumulated into y (for the residual adds).
#ifndef LAZYATTN_KERNELS_INCLUDE_GEMM_H_
#define LAZYATTN_KERNELS_INCLUDE_GEMM_H_

#include <cstdint>

namespace lazyattn {

// y[rows][out] = x[rows][in] * w[out][in]^T  (+ y when accumulate).
void LinearCpu(const float* x, const float* w, int64_t rows, int64_t in, int64_t out, float* y,
               bool accumulate = false);

}  // namespace lazyattn

#endif  // LAZYATTN_KERNELS_INCLUDE_GEMM_H_
