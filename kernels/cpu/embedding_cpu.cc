#include <cstring>

#include "kernels/include/embedding.h"

namespace lazyattn {

void EmbeddingGatherCpu(const float* table, int64_t dim, const int32_t* ids, int n, float* out) {
  for (int t = 0; t < n; ++t) {
    std::memcpy(out + t * dim, table + int64_t{ids[t]} * dim, dim * sizeof(float));
  }
}

}  // namespace lazyattn
