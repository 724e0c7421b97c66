// Copy of KV blocks with re-rotation of K: the `block` cache mode's copy of a cached document to
// a new global offset (DESIGN.md section 3). The lazy mode never needs it; it exists so the two
// modes can be measured side by side.
//
// For each copy and every layer, KV head and slot of the block:
//   K[dst] = R_delta K[src]      (keys cached at position p now sit at p + delta)
//   V[dst] = V[src]
// All block_size slots are copied, valid or not. delta may be negative (moving a document
// earlier); |delta| < rope.max_positions(). Layer l's pools start at pool + l * layer_stride
// elements, each laid out [block][kv_head][slot][head_dim] (kernels/include/paged_attention.h).
// Preconditions: src != dst, and no block is both a source and a destination in one call.
#ifndef LAZYATTN_KERNELS_INCLUDE_BLOCK_COPY_H_
#define LAZYATTN_KERNELS_INCLUDE_BLOCK_COPY_H_

#include <cstdint>

#include "kernels/include/paged_attention.h"
#include "kernels/include/rope.h"

namespace lazyattn {

struct BlockCopy {
  uint32_t src = 0;
  uint32_t dst = 0;
  int32_t delta = 0;
};

// CPU twin (fp32), the reference for the CUDA kernel.
void BlockCopyRerotateCpu(const BlockCopy* copies, int num_copies, int num_layers,
                          int64_t layer_stride, const PagedKvShape& shape, const RopeTable& rope,
                          float* k_pool, float* v_pool);
// The same over F16 pools (the CPU backend's engine.cpu_kv_cache: f16): a re-rotated key is
// widened to fp32, rotated and rounded back to half (one more rounding, at most 2^-11 relative,
// per copy); values and delta-0 copies move bit for bit.
void BlockCopyRerotateCpu(const BlockCopy* copies, int num_copies, int num_layers,
                          int64_t layer_stride, const PagedKvShape& shape, const RopeTable& rope,
                          uint16_t* k_pool, uint16_t* v_pool);

}  // namespace lazyattn

#endif  // LAZYATTN_KERNELS_INCLUDE_BLOCK_COPY_H_
