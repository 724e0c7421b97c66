// Paged decode attention with deferred RoPE (CUDA, sm_90): one query token per sequence.
//
// Semantics (CPU twin: PagedAttentionCpu in kernels/include/paged_attention.h with one query and
// first_query_index = number of keys - 1, i.e. the query sees every key of its table):
//   out[b][h] = softmax_j(scale * q[b][h] . R_{delta(j)} k~_j) v_j
// over the valid slots j of the first num_blocks[b] entries of sequence b's block table, in table
// order. K is stored rotated at segment-LOCAL positions (k~); q arrives rotated at its GLOBAL
// position. Instead of rotating every key forward by its block's delta, the kernel rotates the
// query backward, q' = R_{-delta} q, once per change of delta along the table, always from the
// original q (never from the previous q', so no error accumulates): q'.k~ = q.R_delta k~.
//
// Layout (bf16 storage, fp32 accumulation):
//   q    [batch][num_heads][head_dim]
//   pool [pool_blocks][num_kv_heads][16][head_dim] for K and V alike (block size 16)
//   block_tables [batch][max_blocks_per_seq] packed KvBlockEntry (block | delta | valid)
//   out  [batch][num_heads][head_dim], bf16 or fp32
// head_dim is 64 or 128; num_heads is any multiple of num_kv_heads. The query heads of one KV
// head are processed together (16 per CTA), so K/V are read once per KV head when the group has
// at most 16 heads (ceil(group / 16) times otherwise).
//
// Work split: CTAs are (split, kv head x head tile, sequence). Short batches split each
// sequence's blocks across CTAs so the launch fills every SM; each split writes a partial
// (normalized output, log-sum-exp) to the workspace and the last split of a group to finish
// merges them in the same launch (no second kernel).
#ifndef LAZYATTN_KERNELS_CUDA_PAGED_DECODE_ATTENTION_H_
#define LAZYATTN_KERNELS_CUDA_PAGED_DECODE_ATTENTION_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cuda/rope_table_cuda.h"
#include "kernels/include/kv_block_entry.h"

namespace lazyattn {

enum class DecodeOutputType { kBf16, kFp32 };

// Scratch for split-KV partials and the per-group arrival counters. One workspace per stream:
// two launches in flight on different streams must not share one. Counters are zeroed at
// creation and every launch leaves them zero again.
class PagedDecodeWorkspace {
 public:
  // Sized from the device's SM count (read at run time) for head_dim <= 128.
  static absl::StatusOr<std::unique_ptr<PagedDecodeWorkspace>> Create(int device);
  ~PagedDecodeWorkspace();
  PagedDecodeWorkspace(const PagedDecodeWorkspace&) = delete;
  PagedDecodeWorkspace& operator=(const PagedDecodeWorkspace&) = delete;

  int sm_count() const { return sm_count_; }
  int64_t partial_capacity() const { return partial_capacity_; }  // (group, split) pairs
  float* partial_out() const { return partial_out_; }
  float* partial_lse() const { return partial_lse_; }
  int32_t* counters() const { return counters_; }
  int64_t counter_capacity() const { return counter_capacity_; }

 private:
  PagedDecodeWorkspace() = default;
  int sm_count_ = 0;
  int64_t partial_capacity_ = 0, counter_capacity_ = 0;
  void* memory_ = nullptr;
  float* partial_out_ = nullptr;   // [partial_capacity][16][128]
  float* partial_lse_ = nullptr;   // [partial_capacity][16]
  int32_t* counters_ = nullptr;    // [counter_capacity]
};

struct PagedDecodeArgs {
  const __nv_bfloat16* q = nullptr;
  const __nv_bfloat16* k_pool = nullptr;
  const __nv_bfloat16* v_pool = nullptr;
  const KvBlockEntry* block_tables = nullptr;  // device
  const int32_t* num_blocks = nullptr;         // device, [batch]; clamped to max_blocks_per_seq
  int batch = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int max_blocks_per_seq = 0;  // table row stride; the split size is planned from it
  float scale = 0;             // softmax scale, usually 1/sqrt(head_dim)
  // true: rotate q by -delta per block (lazy mode). false: ignore deltas (K already stored at
  // global positions; also the baseline that measures what the rotation costs).
  bool rotate = true;
  // Needed when rotate: cos/sin rows of each new delta are read from the table (computed in
  // double on the host, stored fp32; computing them in double per delta in the kernel measured
  // up to 11% slower at small batch, see docs/kernels.md). Every delta must be
  // < rope.max_positions (larger ones are clamped to the last row).
  RopeTableView rope;
  void* out = nullptr;
  DecodeOutputType out_type = DecodeOutputType::kBf16;
  // 0: choose the split count from the device (fill every SM once); 1: never split;
  // n > 1: split each sequence into about n parts (clamped to the workspace and the table).
  int num_splits = 0;
  // true: the kernel launched just before this one (launch_overlap.cuh) writes K/V only in
  // each sequence's last block, and q: a warp then issues its first K/V copies of other blocks
  // before waiting for that kernel, overlapping its tail (a decode step's K/V append). The
  // tables and num_blocks must be complete before that kernel starts (a step's metadata is).
  bool early_kv_loads = false;
};

// The split the launcher would use for `args` (for tests and benchmarks).
struct DecodePlan {
  int num_splits = 1;
  int blocks_per_split = 0;
  int ctas_per_sm = 0;
};
absl::StatusOr<DecodePlan> PlanPagedDecode(const PagedDecodeArgs& args,
                                           const PagedDecodeWorkspace& workspace);

// InvalidArgument for bad shapes or missing pointers; Internal for CUDA errors (launch errors
// are checked, not the kernel's completion). Asynchronous on `stream`.
absl::Status PagedDecodeAttention(const PagedDecodeArgs& args, PagedDecodeWorkspace& workspace,
                                  cudaStream_t stream);

}  // namespace lazyattn

#endif  // LAZYATTN_KERNELS_CUDA_PAGED_DECODE_ATTENTION_H_
