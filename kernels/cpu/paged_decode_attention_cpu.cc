// The decode form of paged attention (paged_attention.h): one query token against every key of
// its table, read in place from the pool. The prefill form copies each KV head's keys and values
// out of the pool before its BLAS products; for one query that copy is the whole cost (at a
// 640-token context, 30 MB a decode step on SmolLM2, as many bytes again as it then reads).
//
// Work is split by KV head and by ranges of blocks over the kernel threads (cpu_threads.h); a
// task reads each key and value row once for all the query heads of its KV head (GQA), and the
// ranges' softmax partials are merged at the end. The dot products keep eight partial sums, which
// compilers turn into SIMD adds without reassociation flags; the result differs from the prefill
// form only in rounding.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/half_rows.h"
#include "kernels/include/cpu_threads.h"
#include "kernels/include/paged_attention.h"

namespace lazyattn {
namespace {

float Dot(const float* a, const float* b, int d) {
  float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int x = 0;
  for (; x + 8 <= d; x += 8) {
    for (int i = 0; i < 8; ++i) s[i] += a[x + i] * b[x + i];
  }
  float sum = ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
  for (; x < d; ++x) sum += a[x] * b[x];
  return sum;
}

void Axpy(float p, const float* v, float* acc, int d) {
  for (int x = 0; x < d; ++x) acc[x] += p * v[x];
}

// Blocks a task covers: small enough that two threads share even one KV head's keys, large
// enough that a task's partial results are few.
constexpr int kBlocksPerTask = 16;

// One task: the query heads of one KV head against the keys of blocks [b0, b1), each key and
// value row read once for the whole group. Writes per head the range's largest score, its sum of
// exp(score - max) and its exp-weighted sum of values, merged afterwards (split-K softmax).
// One head's rows of a block ([valid][head_dim]): in place from an fp32 pool, widened into `tile`
// from an F16 one (half the bytes read; the conversion is a few instructions per 8 values).
const float* BlockRows(const float* pool, const uint16_t* pool_f16, int64_t offset, int64_t count,
                       std::vector<float>& tile) {
  if (pool_f16 == nullptr) return pool + offset;
  tile.resize(count);
  cpu_internal::HalfToFloatRow(pool_f16 + offset, count, tile.data());
  return tile.data();
}

void DecodeRange(const PagedAttentionArgs& a, int kv_head, int b0, int b1, float* part_max,
                 double* part_sum, float* part_acc, std::vector<float>& q_rot,
                 std::vector<float>& scores, std::vector<float>& tile) {
  const int d = a.shape.head_dim;
  const int group = a.num_heads / a.shape.num_kv_heads;
  int64_t keys = 0;
  for (int b = b0; b < b1; ++b) keys += KvEntryValid(a.block_table[b]);
  scores.resize(keys * group);
  q_rot.resize(int64_t{group} * d);
  std::fill_n(part_max, group, -std::numeric_limits<float>::infinity());
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
    // A block's keys of one head are contiguous: [block_size][head_dim].
    const float* k = BlockRows(a.k_pool, a.k_pool_f16, a.shape.offset(KvEntryBlock(e), kv_head, 0),
                               int64_t{KvEntryValid(e)} * d, tile);
    for (uint32_t s = 0; s < KvEntryValid(e); ++s, ++j) {
      for (int g = 0; g < group; ++g) {
        const float score = Dot(q_rot.data() + int64_t{g} * d, k + int64_t{s} * d, d) * a.scale;
        scores[j * group + g] = score;
        part_max[g] = std::max(part_max[g], score);
      }
    }
  }
  std::fill_n(part_sum, group, 0.0);
  std::fill_n(part_acc, int64_t{group} * d, 0.0f);
  j = 0;
  for (int b = b0; b < b1; ++b) {
    const KvBlockEntry e = a.block_table[b];
    const float* v = BlockRows(a.v_pool, a.v_pool_f16, a.shape.offset(KvEntryBlock(e), kv_head, 0),
                               int64_t{KvEntryValid(e)} * d, tile);
    for (uint32_t s = 0; s < KvEntryValid(e); ++s, ++j) {
      for (int g = 0; g < group; ++g) {
        const float p = std::exp(scores[j * group + g] - part_max[g]);
        part_sum[g] += p;
        Axpy(p, v + int64_t{s} * d, part_acc + int64_t{g} * d, d);
      }
    }
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
  const int ranges = (a.num_blocks + kBlocksPerTask - 1) / kBlocksPerTask;
  const int64_t tasks = int64_t{kv_heads} * ranges;
  std::vector<float> part_max(tasks * group), part_acc(tasks * group * d);
  std::vector<double> part_sum(tasks * group);
  // Short contexts stay on the calling thread (CpuWorkGrain).
  const int64_t work = 2 * int64_t{group} * d * a.shape.block_size * kBlocksPerTask;
  CpuParallelFor(tasks, CpuWorkGrain(tasks, 1, work), [&](int64_t begin, int64_t end) {
    std::vector<float> q_rot, scores, tile;
    for (int64_t t = begin; t < end; ++t) {
      const int kv_head = static_cast<int>(t / ranges), r = static_cast<int>(t % ranges);
      DecodeRange(a, kv_head, r * kBlocksPerTask, std::min(a.num_blocks, (r + 1) * kBlocksPerTask),
                  &part_max[t * group], &part_sum[t * group], &part_acc[t * group * d], q_rot,
                  scores, tile);
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
