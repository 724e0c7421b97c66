// RoPE for new tokens and their write into the paged KV cache (CUDA), one launch per layer.
//
// For each new token t (the QKV projection's output, bf16):
//   q_out[t][h] = R_{deltas[t] + local_positions[t]} q[t][h]   (GLOBAL position: what attention
//                                                              sees the query at)
//   K pool slot slots[t] <- R_{local_positions[t]} k[t][kv]    (segment-LOCAL: the cache stays
//                                                              valid at any offset)
//   V pool slot slots[t] <- v[t][kv]
// slot = block * 16 + offset within the block; a negative slot skips the K/V write (padding).
// Rotation in fp32 with the table's cos/sin (DeviceRopeTable), results rounded to bf16 once.
// CPU twin: RopeApplyCpu on q and k, then PagedKvWriteCpu.
#ifndef LAZYATTN_KERNELS_CUDA_ROPE_KV_APPEND_H_
#define LAZYATTN_KERNELS_CUDA_ROPE_KV_APPEND_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/rope_table_cuda.h"

namespace lazyattn {

struct RopeKvAppendArgs {
  // Rows of num_heads (q) or num_kv_heads (k, v) heads of head_dim values; the row strides (in
  // elements) let q, k and v be column ranges of one fused QKV output.
  const __nv_bfloat16* q = nullptr;
  int64_t q_row_stride = 0;
  const __nv_bfloat16* k = nullptr;
  int64_t k_row_stride = 0;
  const __nv_bfloat16* v = nullptr;
  int64_t v_row_stride = 0;
  int num_tokens = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;  // even, <= 256
  const int32_t* local_positions = nullptr;  // device [num_tokens], >= 0
  const int32_t* deltas = nullptr;           // device [num_tokens], >= 0 (segment offsets)
  const int64_t* slots = nullptr;            // device [num_tokens]
  RopeTableView rope;  // positions past the table are clamped to its last row
  __nv_bfloat16* q_out = nullptr;  // [num_tokens][num_heads][head_dim]; may equal q when
                                   // q_row_stride == num_heads * head_dim
  __nv_bfloat16* k_pool = nullptr;  // [blocks][num_kv_heads][16][head_dim]
  __nv_bfloat16* v_pool = nullptr;
};

absl::Status RopeKvAppend(const RopeKvAppendArgs& args, cudaStream_t stream);

}  // namespace lazyattn

#endif  // LAZYATTN_KERNELS_CUDA_ROPE_KV_APPEND_H_
