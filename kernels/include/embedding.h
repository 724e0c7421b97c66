// Embedding gather: out[t] = table[ids[t]] (CPU twin).
#ifndef LAZYATTN_KERNELS_INCLUDE_EMBEDDING_H_
#define LAZYATTN_KERNELS_INCLUDE_EMBEDDING_H_

#include <cstdint>

namespace lazyattn {

// Precondition: 0 <= ids[t] < vocab (the engine validates ids at the request boundary).
void EmbeddingGatherCpu(const float* table, int64_t dim, const int32_t* ids, int n, float* out);

}  // namespace lazyattn

#endif  // LAZYATTN_KERNELS_INCLUDE_EMBEDDING_H_
