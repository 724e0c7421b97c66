// The decode form of paged attention (paged_attention.h): one query token against every key of
// its table, read in place from the pool. The prefill form copies each KV head's keys and values
// out of the pool before its BLAS products; for one query that copy is the whole cost (at a
// 640-token context, 30 MB a decode step on SmolLM2, as many bytes again as it then reads).
//
// Work is split by KV head and by ranges of blocks over the kernel threads (cpu_threads.h); a
// task reads each key and value row once for all the query heads of its KV head (GQA), and the
// ranges' softmax partials are merged at the end. The row loops (decode_rows.h) run AVX2 with F16
// pools widened in registers, or portable; the result differs from the prefill form only in
// rounding.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/decode_rows.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/include/cpu_threads.h"
#include "kernels/include/paged_attention.h"

namespace lazyattn {
namespace {

void Axpy(float p, const float* v, float* acc, int d) {
  for (int x = 0; x < d; ++x) acc[x] += p * v[x];
}

// Blocks a task covers: small enough that two threads share even one KV head's keys, large
// enough that a task's partial results are few.
constexpr int kBlocksPerTask = 16;

// One head's rows of a block ([valid][head_dim], contiguous), in the pool's own type.
cpu_internal::KvRows BlockRows(const float* pool, const uint16_t* pool_f16, int64_t offset,
                               int64_t rows) {
  if (pool_f16 != nullptr) return {.f16 = pool_f16 + offset, .rows = rows};
  return {.f32 = pool + offset, .rows = rows};
}

// One task: the query heads of one KV head against the keys of blocks [b0, b1), each key and
// value row read once for the whole group. Writes per head the range's largest score, its sum of
// exp(score - max) and its exp-weighted sum of values, merged afterwards (split-K softmax).
void DecodeRange(const PagedAttentionArgs& a, int kv_head, int b0, int b1, float* part_max,
                 double* part_sum, float* part_acc, std::vector<float>& q_rot,
                 std::vector<float>& scores) {
  const int d = a.shape.head_dim;
  const int group = a.num_heads / a.shape.num_kv_heads;
  int64_t keys = 0;
  for (int b = b0; b < b1; ++b) keys += KvEntryValid(a.block_table[b]);
  scores.resize(keys * group);
  q_rot.resize(int64_t{group} * d);
  int64_t current_delta = -1, j = 0;
  for (int b = b0; b < b1; ++b) {
    const KvBlockEntry e = a.block_table[b];
    const int64_t delta = KvEntryDelta(e);
    if (delta != current_delta) {  // once per segment: recompute from the original q
      for (int g = 0; g < group; ++g) {
        const float* q = a.q + (int64_t{kv_head} * group + g) * d;
        std::copy(q, q + d, q_rot.begin() + int64_t{g} * d);
        if (delta != 0) RopeRotateHeadCpu(q_rot.data() + int64_t{g} * d, -delta, *a.rope);
      }
      current_delta = delta;
    }
    const int64_t off = a.shape.offset(KvEntryBlock(e), kv_head, 0);
    cpu_internal::ScoreRows(q_rot.data(), group, d, a.scale,
                            BlockRows(a.k_pool, a.k_pool_f16, off, KvEntryValid(e)),
                            &scores[j * group]);
    j += KvEntryValid(e);
  }
  // Weights exp(score - max) per query head, their sums in double.
  std::fill_n(part_max, group, -std::numeric_limits<float>::infinity());
  for (int64_t i = 0; i < keys; ++i) {
    for (int g = 0; g < group; ++g) part_max[g] = std::max(part_max[g], scores[i * group + g]);
  }
  for (int64_t i = 0; i < keys; ++i) {
    for (int g = 0; g < group; ++g) scores[i * group + g] -= part_max[g];
  }
  cpu_internal::ExpShiftSum(scores.data(), keys * group, 0.0f);
  std::fill_n(part_sum, group, 0.0);
  for (int64_t i = 0; i < keys; ++i) {
    for (int g = 0; g < group; ++g) part_sum[g] += scores[i * group + g];
  }
  std::fill_n(part_acc, int64_t{group} * d, 0.0f);
  j = 0;
  for (int b = b0; b < b1; ++b) {
    const KvBlockEntry e = a.block_table[b];
    const int64_t off = a.shape.offset(KvEntryBlock(e), kv_head, 0);
    cpu_internal::AccumulateRows(&scores[j * group], group, d,
                                 BlockRows(a.v_pool, a.v_pool_f16, off, KvEntryValid(e)), part_acc);
    j += KvEntryValid(e);
  }
}

}  // namespace

void PagedDecodeAttentionCpu(const PagedAttentionArgs& a) {
  const int d = a.shape.head_dim;
  const int kv_heads = a.shape.num_kv_heads;
  const int group = a.num_heads / kv_heads;
  int64_t n_keys = 0;
  for (int b = 0; b < a.num_blocks; ++b) n_keys += KvEntryValid(a.block_table[b]);
  if (n_keys == 0) {
    std::fill_n(a.out, int64_t{a.num_heads} * d, 0.0f);
    return;
  }
  // Ranges of equal size, as many as make the task count a multiple of the threads, so the
  // threads' contiguous shares of tasks hold equal numbers of blocks (3 heads x 36 blocks in
  // ranges of 16, 16, 4 gave two threads 68 and 40 blocks).
  const int threads = std::max(1, CpuKernelThreads());
  int ranges = (a.num_blocks + kBlocksPerTask - 1) / kBlocksPerTask;
  while ((int64_t{kv_heads} * ranges) % threads != 0 && ranges < a.num_blocks) ++ranges;
  const int per_range = (a.num_blocks + ranges - 1) / ranges;
  const int64_t tasks = int64_t{kv_heads} * ranges;
  std::vector<float> part_max(tasks * group), part_acc(tasks * group * d);
  std::vector<double> part_sum(tasks * group);
  // Short contexts stay on the calling thread (CpuWorkGrain).
  const int64_t work = 2 * int64_t{group} * d * a.shape.block_size * per_range;
  CpuParallelFor(tasks, CpuWorkGrain(tasks, 1, work), [&](int64_t begin, int64_t end) {
    std::vector<float> q_rot, scores;
    for (int64_t t = begin; t < end; ++t) {
      const int kv_head = static_cast<int>(t / ranges), r = static_cast<int>(t % ranges);
      DecodeRange(a, kv_head, std::min(a.num_blocks, r * per_range),
                  std::min(a.num_blocks, (r + 1) * per_range), &part_max[t * group],
                  &part_sum[t * group], &part_acc[t * group * d], q_rot, scores);
    }
  });
  // Merge the ranges of each head: rescale every range to the head's largest score.
  for (int kv_head = 0; kv_head < kv_heads; ++kv_head) {
    for (int g = 0; g < group; ++g) {
      float* out = a.out + (int64_t{kv_head} * group + g) * d;
      float max_score = -std::numeric_limits<float>::infinity();
      for (int r = 0; r < ranges; ++r) {
        max_score = std::max(max_score, part_max[(int64_t{kv_head} * ranges + r) * group + g]);
      }
      double sum = 0;
      std::fill_n(out, d, 0.0f);
      for (int r = 0; r < ranges; ++r) {
        const int64_t i = (int64_t{kv_head} * ranges + r) * group + g;
        if (part_sum[i] == 0) continue;  // a range without keys
        const float w = std::exp(part_max[i] - max_score);
        sum += part_sum[i] * w;
        Axpy(w, &part_acc[i * d], out, d);
      }
      const float inv = static_cast<float>(1.0 / sum);
      for (int x = 0; x < d; ++x) out[x] *= inv;
    }
  }
}

}  // namespace lazyattn
