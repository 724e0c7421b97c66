// Paged prefill attention with deferred RoPE (CUDA, bf16 storage, fp32 accumulation).
//
// Computes, for a varlen batch of sequences, exactly what PagedAttentionCpu computes for each
// sequence (kernels/include/paged_attention.h is the contract): the keys of a sequence's block
// table, counted over valid slots in table order, get sequence indices 0, 1, 2, ...; query i of
// the sequence (index first_query_index + i) sees every key whose index is <= its own. Each key
// is used rotated forward by its block's delta (K is cached rotated at segment-local positions).
//
// Tensors (device memory, bf16):
//   q    [total_queries][num_heads][head_dim]   sequences back to back, in plan order; rotated at
//                                              GLOBAL positions (as the model's RoPE left them)
//   pool [block][num_kv_heads][16][head_dim]    K and V separately, K rotated at local positions
//   out  [total_queries][num_heads][head_dim]
//   rope_cos / rope_sin [max_positions][head_dim/2] fp32, RopeTable's layout (computed in double)
//
// Usage (one plan per engine step, reused by every layer):
//   PagedPrefillPlan plan;
//   RETURN_IF_ERROR(plan.Build(shape, seqs, num_seqs, options));   // host only
//   RETURN_IF_ERROR(plan.Upload(d_meta, stream));                    // one cudaMemcpyAsync
//   for each layer: RETURN_IF_ERROR(PagedPrefillAttention(plan, args, rotation, stream));
// d_meta needs plan.metadata_bytes() (16-byte aligned, cudaMalloc's is); args.workspace needs
// plan.workspace_bytes() (split-KV partial results; 0 when the plan does not split).
//
// Supported: head_dim 64 or 128, block size 16, any GQA ratio up to 128 query heads per KV head.
// Precision: QK^T and PV on bf16 tensor cores with fp32 accumulation; the delta rotation is done
// in fp32 from the fp32 cos/sin table and its result rounded to bf16 once (rotated K in kRotateK,
// rotated Q in kRotateQ); probabilities are rounded to bf16 for PV, as FlashAttention does.
//
// Two kernels compute this same function from the same plan and merge (PagedPrefillArgs::kernel):
// the FlashAttention-2-style mma.sync kernel (every head dim and rotation; the default) and a
// Hopper wgmma kernel, kWgmmaWs (sm_90a, FlashAttention-3 style: a producer warpgroup fills
// mbarrier-handed stages, two consumer warpgroups of 64 query rows take turns in ping-pong), for
// head_dim 128 with kRotateQ or kNone. Asked for a shape or rotation the wgmma kernel does not
// cover (PrefillWgmmaSupports() false: head_dim 64, kRotateK), the launcher runs the mma.sync
// kernel instead, silently. The wgmma kernel runs only on compute capability 9.0 devices (its
// code is sm_90a only); elsewhere the launch returns the CUDA error as Internal.
#ifndef LAZYATTN_KERNELS_CUDA_PAGED_PREFILL_ATTENTION_H_
#define LAZYATTN_KERNELS_CUDA_PAGED_PREFILL_ATTENTION_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "kernels/include/kv_block_entry.h"

namespace lazyattn {

// Where the deferred rotation happens. Both rotating forms compute the same function.
//   kRotateQ: each warp keeps its query rows rotated BACKWARD by the current delta,
//             q' = R_{-delta} q, recomputed from the original q only when delta changes (once per
//             document); K tiles go to the tensor cores untouched. The default.
//   kRotateK: each K tile is rotated forward by its blocks' deltas in shared memory, once per
//             CTA, before Q K^T (the form DESIGN.md section 2 describes for prefill).
//   kNone:    no rotation (deltas ignored): the baseline that prices the rotation; correct only
//             when every delta is 0, e.g. a document encoding.
enum class PrefillRotation { kRotateQ, kRotateK, kNone };

// Which attention kernel runs (both compute the same function; see the top of this file).
//   kMmaSync: mma.sync m16n8k16, FlashAttention-2 style; every head dim and rotation.
//   kWgmmaWs: wgmma m64nNk16 on Hopper (sm_90a), warp-specialized (384 threads: a producer
//             warpgroup gathers K/V into mbarrier-guarded stages, two consumer warpgroups with
//             setmaxnreg take turns on the tensor cores); head_dim 128 with kRotateQ or kNone,
//             else the launcher falls back to kMmaSync. Its compiled variants
//             (PagedPrefillArgs::variant) are for benchmarks; all compute the same function.
enum class PrefillKernel { kMmaSync, kWgmmaWs };

// Whether PrefillKernel::kWgmmaWs runs for this head dim and rotation (else mma.sync runs).
bool PrefillWgmmaSupports(int head_dim, PrefillRotation rotation);

// CTAs an SM holds at once of the attention kernel that `kernel` selects for this head dim and
// rotation: 2 for mma.sync, 1 for wgmma-ws (and 2 where it falls back to mma.sync).
// The value for PagedPrefillPlanOptions::ctas_per_sm.
int PrefillCtasPerSm(PrefillKernel kernel, int head_dim, PrefillRotation rotation);

// kWgmmaWs's compiled variants: how many, and a short name for each ("pp-s5": ping-pong between
// the consumers, 5 stages; "nopp-s5": no ping-pong; ...); "?" outside 0..count-1.
int PrefillWgmmaWsVariants();
const char* PrefillWgmmaWsVariantName(int variant);

struct PagedPrefillShape {
  int num_heads = 0;  // query heads, a multiple of num_kv_heads
  int num_kv_heads = 0;
  int head_dim = 0;                      // 64 or 128
  int block_size = kDefaultKvBlockSize;  // 16 only
  int64_t num_pool_blocks = 0;           // > 0: every block id must be below it
};

// One sequence of the batch (host memory; read only during Build()).
struct PagedPrefillSequence {
  int num_queries = 0;                        // new query tokens of this sequence in q/out
  int64_t first_query_index = 0;              // sequence index of the first of them
  const KvBlockEntry* block_table = nullptr;  // num_blocks entries, valid counts 1..16
  int num_blocks = 0;
};

struct PagedPrefillPlanOptions {
  int sm_count = 0;                // from DeviceInfo; <= 0 disables split-KV
  int64_t rope_max_positions = 0;  // every delta must be below it
  int max_splits = 32;             // KV splits per query tile, at most 64; 1 disables them
  // CTAs of the kernel an SM runs at once, >= 1: KV is split so that the grid fills about
  // sm_count x ctas_per_sm CTAs (splits a query tile = sm_count x ctas_per_sm / (query tiles x
  // KV heads), within 1..max_splits, at least 4 K tiles a split). PrefillCtasPerSm() gives it for
  // the kernel that will run (2: mma.sync, the default; 1: wgmma-ws). Any plan computes the same
  // function on either kernel; only the speed differs.
  int ctas_per_sm = 2;
};

// Host-built schedule and metadata of one prefill call. Metadata layout (int32 words, one array,
// uploaded with one copy):
//   seqs     [num_seqs][8]      q_start, q_len, entry_start, num_entries, first_query_index,
//                               break_start, 0, 0
//   entries  [num_entries][4]   physical block, delta, valid slots, sequence index of slot 0
//   breaks   per sequence, [tiles + 2] from break_start (tiles = its K tiles, ceil(entries / 4)):
//                               breaks[j] = the first K tile >= j that is not plain, tiles if
//                               none (breaks[0] = 0; breaks[tiles] = breaks[tiles + 1] = tiles,
//                               sentinels). Tile j >= 1 is plain
//                               when its entries share one delta and that is the delta q' is left
//                               at by tile j - 1 (kRotateQ: the delta of tile j - 1's last pass,
//                               its distinct delta that appears last for the first time)
//   work     [num_work][8]      seq, first token, tokens, first K tile, end K tile, partial (-1:
//                               writes out directly), first tile of the range that is not plain
//                               starting from q' = q (delta 0), 0   (sorted, heaviest first)
//   combine  [num_combine][8]   seq, first token, tokens, first partial, number of splits, 0..
// A K tile is 4 consecutive table entries (64 slots); one CTA handles 128 query rows = up to
// 128/group tokens x group heads of one KV head, so heads of a group share every K/V load.
class PagedPrefillPlan {
 public:
  absl::Status Build(const PagedPrefillShape& shape, const PagedPrefillSequence* seqs, int num_seqs,
                     const PagedPrefillPlanOptions& options);
  absl::Status Upload(void* device_metadata, cudaStream_t stream) const;

  int64_t metadata_bytes() const { return static_cast<int64_t>(words_.size()) * 4; }
  // The metadata_bytes() that Upload() copies, for callers that pack it into their own upload.
  const int32_t* metadata() const { return words_.data(); }
  int64_t workspace_bytes() const;
  int64_t total_queries() const { return total_queries_; }
  const PagedPrefillShape& shape() const { return shape_; }
  int num_work_items() const { return num_work_; }
  int num_split_groups() const { return num_combine_; }

  // Internal to the launcher.
  struct Layout {
    int64_t seqs = 0, entries = 0, breaks = 0, work = 0, combine = 0;  // word offsets
  };
  const Layout& layout() const { return layout_; }
  int num_partials() const { return num_partials_; }

 private:
  PagedPrefillShape shape_;
  std::vector<int32_t> words_;
  Layout layout_;
  int num_work_ = 0, num_combine_ = 0, num_partials_ = 0;
  int64_t total_queries_ = 0;
};

struct PagedPrefillArgs {
  const __nv_bfloat16* q = nullptr;
  const __nv_bfloat16* k_pool = nullptr;
  const __nv_bfloat16* v_pool = nullptr;
  const float* rope_cos = nullptr;  // unused by kNone
  const float* rope_sin = nullptr;
  float scale = 0;  // softmax scale, usually 1/sqrt(head_dim)
  __nv_bfloat16* out = nullptr;
  const void* device_metadata = nullptr;           // the plan, Upload()ed
  void* workspace = nullptr;                       // plan.workspace_bytes()
  PrefillKernel kernel = PrefillKernel::kMmaSync;  // kWgmmaWs: see PrefillWgmmaSupports()
  // kWgmmaWs only: which compiled variant runs, 0..PrefillWgmmaWsVariants()-1 (0, the default,
  // is the one to use; the others exist to be measured). Ignored by the other kernels.
  int variant = 0;
};

// Enqueues the attention (and, when the plan splits KV, the merge of the splits) on `stream`.
// InvalidArgument for missing pointers or a kWgmmaWs variant out of range; Internal for CUDA
// launch errors.
absl::Status PagedPrefillAttention(const PagedPrefillPlan& plan, const PagedPrefillArgs& args,
                                   PrefillRotation rotation, cudaStream_t stream);

}  // namespace lazyattn

#endif  // LAZYATTN_KERNELS_CUDA_PAGED_PREFILL_ATTENTION_H_
