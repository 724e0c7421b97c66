#include <cmath>

#include "kernels/include/swiglu.h"

namespace lazyattn {

void SwiGluCpu(const float* gate_up, int64_t rows, int64_t dim, float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = gate_up + r * 2 * dim;
    const float* u = g + dim;
    float* o = out + r * dim;
    for (int64_t i = 0; i < dim; ++i) o[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
  }
}

}  // namespace lazyattn
