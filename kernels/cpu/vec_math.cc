#include "kernels/cpu/vec_math.h"

#include <cmath>

#include "kernels/include/quant_linear.h"

namespace lazyattn::cpu_internal {
namespace {

bool UseAvx2() {
  static const bool avx2 = CpuSupportsIsa(CpuIsa::kAvx2);
  return avx2;
}

}  // namespace

double ExpShiftSumPortable(float* x, int64_t n, float shift) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - shift);
    sum += x[i];
  }
  return sum;
}

void SiluMulPortable(const float* g, const float* u, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
}

double ExpShiftSum(float* x, int64_t n, float shift) {
  return UseAvx2() ? ExpShiftSumAvx2(x, n, shift) : ExpShiftSumPortable(x, n, shift);
}

void SiluMul(const float* g, const float* u, int64_t n, float* out) {
  if (UseAvx2()) {
    SiluMulAvx2(g, u, n, out);
  } else {
    SiluMulPortable(g, u, n, out);
  }
}

}  // namespace lazyattn::cpu_internal
