#include <cmath>

#include "kernels/include/rms_norm.h"

namespace lazyattn {

void RmsNormCpu(const float* x, const float* weight, int rows, int dim, float eps, float* out) {
  for (int r = 0; r < rows; ++r) {
    const float* xr = x + static_cast<long>(r) * dim;
    float* yr = out + static_cast<long>(r) * dim;
    double sum_sq = 0;  // double: dims of 8K with large activations lose bits in fp32
    for (int i = 0; i < dim; ++i) sum_sq += static_cast<double>(xr[i]) * xr[i];
    const float inv = static_cast<float>(1.0 / std::sqrt(sum_sq / dim + eps));
    for (int i = 0; i < dim; ++i) yr[i] = xr[i] * inv * weight[i];
  }
}

}  // namespace lazyattn
