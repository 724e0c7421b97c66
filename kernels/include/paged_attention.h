// Attention over a paged KV cache with deferred RoPE (CPU twin; the CUDA kernels match it).
//
// KV pool layout, per layer, for K and V alike (HND within a block, so one KV head of one block is a
// contiguous [block_size][head_dim] tile):
//   pool[block][kv_head][slot][head_dim]
// Keys are stored rotated at their segment-local positions; the block table entry's delta rotates
// them forward to their global position at attention time (DESIGN.md section 2).
//
// Visibility is by sequence index: the keys of the table, in order and counting only valid slots,
// get indices 0, 1, 2, ...; query q (0-based within this call) has sequence index
// `first_query_index + q` and sees every key whose index is <= its own. A document encoded alone is
// a table holding only its own blocks; a request's query sees every document block before it and
// its own tokens causally.
#ifndef LAZYATTN_KERNELS_INCLUDE_PAGED_ATTENTION_H_
#define LAZYATTN_KERNELS_INCLUDE_PAGED_ATTENTION_H_

#include <cstdint>

#include "kernels/include/kv_block_entry.h"
#include "kernels/include/rope.h"

namespace lazyattn {

struct PagedKvShape {
  int num_kv_heads = 0;
  int head_dim = 0;
  int block_size = kDefaultKvBlockSize;
  int64_t block_stride() const { return int64_t{num_kv_heads} * block_size * head_dim; }
  int64_t offset(uint32_t block, int kv_head, int slot) const {
    return block * block_stride() + (int64_t{kv_head} * block_size + slot) * head_dim;
  }
};

struct PagedAttentionArgs {
  const float* q = nullptr;  // [num_queries][num_heads][head_dim], rotated at global positions
  int num_queries = 0;
  int num_heads = 0;          // query heads; a multiple of shape.num_kv_heads (GQA)
  int64_t first_query_index = 0;
  const KvBlockEntry* block_table = nullptr;
  int num_blocks = 0;
  const float* k_pool = nullptr;
  const float* v_pool = nullptr;
  PagedKvShape shape;
  float scale = 0;             // softmax scale, usually 1/sqrt(head_dim)
  const RopeTable* rope = nullptr;  // for the deltas; every delta must be < rope->max_positions()
  float* out = nullptr;        // [num_queries][num_heads][head_dim]
  // F16 pools (IEEE half bits, the same layout), for an F16 KV cache: when set they are read
  // instead of k_pool / v_pool, each value widened to fp32 as it is read (set both or neither).
  const uint16_t* k_pool_f16 = nullptr;
  const uint16_t* v_pool_f16 = nullptr;
};

// Prefill form: each key is rotated forward by its block's delta, then softmax(q.k * scale) v.
void PagedAttentionCpu(const PagedAttentionArgs& args);

// Decode form, for one query token (args.num_queries == 1) that sees every key of the table: the
// query is rotated BACKWARD by a block's delta instead of rotating the block's keys forward
// ((R_-delta q).k~ = q.(R_delta k~)), and only when delta changes from the previous block,
// always from the original q so rounding cannot accumulate. The same function as the prefill
// form; this is the CPU twin of the CUDA decode kernel's schedule.
void PagedDecodeAttentionCpu(const PagedAttentionArgs& args);

// Writes `n` new tokens' K and V (k/v: [n][num_kv_heads][head_dim], K already rotated at its
// segment-local position) into the slots `slots[t]` = block * block_size + slot_in_block.
void PagedKvWriteCpu(const float* k, const float* v, int n, const int64_t* slots,
                     const PagedKvShape& shape, float* k_pool, float* v_pool);
// The same into F16 pools: each value rounded to the nearest half (ties to even); magnitudes of
// 65520 and more become +-inf, as in llama.cpp's F16 cache, and attention over such a key or value
// then gives NaN where an f32 pool would not (the models' keys and values stay far below).
void PagedKvWriteCpu(const float* k, const float* v, int n, const int64_t* slots,
                     const PagedKvShape& shape, uint16_t* k_pool, uint16_t* v_pool);

}  // namespace lazyattn

#endif  // LAZYATTN_KERNELS_INCLUDE_PAGED_ATTENTION_H_
