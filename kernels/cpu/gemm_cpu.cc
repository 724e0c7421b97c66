#include <cblas.h>

#include "kernels/include/gemm.h"

namespace lazyattn {

void LinearCpu(const float* x, const float* w, int64_t rows, int64_t in, int64_t out, float* y,
               bool accumulate) {
  const float beta = accumulate ? 1.0f : 0.0f;
  if (rows == 1) {
    cblas_sgemv(CblasRowMajor, CblasNoTrans, out, in, 1.0f, w, in, x, 1, beta, y, 1);
    return;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, out, in, 1.0f, x, in, w, in, beta, y,
              out);
}

}  // namespace lazyattn
