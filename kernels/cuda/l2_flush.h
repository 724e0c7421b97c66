// Evicts a buffer's worth of lines from L2 by reading it (timing helpers: autotuning, benchmarks).
#ifndef LAZYATTN_KERNELS_CUDA_L2_FLUSH_H_
#define LAZYATTN_KERNELS_CUDA_L2_FLUSH_H_

#include <cuda_runtime_api.h>

#include <cstddef>

#include "absl/status/status.h"

namespace lazyattn {

// Reads `bytes` of `buffer` (device memory, 16-byte aligned; bytes a multiple of 16) on
// `stream`. Reading, unlike a memset, leaves L2 full of clean lines, as a forward step that
// streams weights and KV does: the next kernel's misses then cost no write-backs.
absl::Status FlushL2ByReading(const void* buffer, size_t bytes, cudaStream_t stream);

}  // namespace lazyattn

#endif  // LAZYATTN_KERNELS_CUDA_L2_FLUSH_H_
