// Embedding gather on bf16 (CUDA): out[t] = table[ids[t]]. CPU twin: EmbeddingGatherCpu.
// An id outside [0, vocab) yields a zero row instead of reading out of bounds (the engine
// validates ids at the request boundary; this keeps a bad id from faulting the worker).
#ifndef LAZYATTN_KERNELS_CUDA_EMBEDDING_H_
#define LAZYATTN_KERNELS_CUDA_EMBEDDING_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace lazyattn {

absl::Status EmbeddingGatherCuda(const __nv_bfloat16* table, int64_t vocab, int64_t dim,
                                 const int32_t* ids, int n, __nv_bfloat16* out,
                                 cudaStream_t stream);

// The same gather into fp32 rows (the start of an fp32 residual stream).
absl::Status EmbeddingGatherToF32Cuda(const __nv_bfloat16* table, int64_t vocab, int64_t dim,
                                      const int32_t* ids, int n, float* out, cudaStream_t stream);

}  // namespace lazyattn

#endif  // LAZYATTN_KERNELS_CUDA_EMBEDDING_H_
