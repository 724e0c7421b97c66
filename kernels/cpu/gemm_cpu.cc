#include "kernels/include/gemm.h"

#include "kernels/include/quant_linear.h"

namespace lazyattn {

// fp32 weights are one of the stored types: the same split over the kernel threads (fused dots
// for few rows, OpenBLAS tiles for many).
void LinearCpu(const float* x, const float* w, int64_t rows, int64_t in, int64_t out, float* y,
               bool accumulate) {
  const QuantMatrixView view{WeightType::kF32, reinterpret_cast<const uint8_t*>(w), out, in};
  QuantLinearCpu(x, rows, view, y, out, accumulate);
}

}  // namespace lazyattn
