// GGUF tensor data to bf16 on the GPU (CUDA). CPU twin: DequantizeToF32 (services/worker/model/
// ggml_type.h) followed by round-to-nearest-even bf16, which this matches bit for bit: the same
// fp32 arithmetic (separate multiply and add, no fused multiply-add), the same half decoding.
// Kept apart from cuda_model_weights so it compiles as CUDA C++17 without the model headers.
#ifndef LAZYATTN_SERVICES_WORKER_CUDA_GGUF_DEQUANTIZE_H_
#define LAZYATTN_SERVICES_WORKER_CUDA_GGUF_DEQUANTIZE_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace lazyattn {

// The ggml type ids this converts (ggml's `enum ggml_type`, as GgmlType spells them).
inline constexpr uint32_t kGgufF32 = 0, kGgufF16 = 1, kGgufQ4_0 = 2, kGgufQ4_1 = 3,
                          kGgufQ8_0 = 8, kGgufBf16 = 30;

// `src` (device memory) holds `rows` x `cols` values of ggml type `type`, row-major, as in a
// GGUF file (quantized types: `cols` a multiple of 32). Writes them as bf16 to `dst`. With
// `rope_head_dim` > 0 the rows come in llama.cpp's interleaved RoPE order within each group of
// rope_head_dim rows (row 2i + j of a head holds half-split row j * rope_head_dim/2 + i) and are
// written in half-split order, as UnpermuteGgufRopeRows does on the host. InvalidArgument for an
// unknown type or a shape that does not fit it.
absl::Status DequantizeGgufToBf16(uint32_t type, const void* src, int64_t rows, int64_t cols,
                                  int rope_head_dim, __nv_bfloat16* dst, cudaStream_t stream);

}  // namespace lazyattn

#endif  // LAZYATTN_SERVICES_WORKER_CUDA_GGUF_DEQUANTIZE_H_
