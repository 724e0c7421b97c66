// CUDA block copy with K re-rotation (bf16 pools); contract and CPU twin in
// kernels/include/block_copy.h. K is rotated in fp32 with the table's cos/sin and rounded to bf16
// once. One launch covers every layer.
#ifndef LAZYATTN_KERNELS_CUDA_BLOCK_COPY_REROTATE_H_
#define LAZYATTN_KERNELS_CUDA_BLOCK_COPY_REROTATE_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/rope_table_cuda.h"
#include "kernels/include/block_copy.h"

namespace lazyattn {

struct BlockCopyRerotateArgs {
  const BlockCopy* copies = nullptr;  // device [num_copies]; |delta| < rope.max_positions
  int num_copies = 0;
  int num_layers = 0;
  int64_t layer_stride = 0;  // elements between layers' pools
  int num_kv_heads = 0;
  int head_dim = 0;          // even, <= 256
  RopeTableView rope;
  __nv_bfloat16* k_pool = nullptr;  // layer 0; [block][kv_head][16][head_dim]
  __nv_bfloat16* v_pool = nullptr;
};

absl::Status BlockCopyRerotate(const BlockCopyRerotateArgs& args, cudaStream_t stream);

}  // namespace lazyattn

#endif  // LAZYATTN_KERNELS_CUDA_BLOCK_COPY_REROTATE_H_
