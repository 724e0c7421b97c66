// RMSNorm: out[i] = x[i] / sqrt(mean(x^2) + eps) * weight[i], row by row, fp32 (CPU twin).
#ifndef LAZYATTN_KERNELS_INCLUDE_RMS_NORM_H_
#define LAZYATTN_KERNELS_INCLUDE_RMS_NORM_H_

namespace lazyattn {

// x, out: [rows][dim] (may alias); weight: [dim].
void RmsNormCpu(const float* x, const float* weight, int rows, int dim, float eps, float* out);

}  // namespace lazyattn

#endif  // LAZYATTN_KERNELS_INCLUDE_RMS_NORM_H_
