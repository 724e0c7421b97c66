// The decode form of paged attention (paged_attention.h): one query token against every key of
// its table, read in place from the pool. The prefill form copies each KV head's keys and values
// out of the pool before its BLAS products; for one query that copy is the whole cost (at a
// 640-token context, 30 MB a decode step on SmolLM2, as many bytes again as it then reads).
//
// Query heads are split over the kernel threads (cpu_threads.h). The dot products and the
// weighted sums keep eight partial sums, which compilers turn into SIMD adds without reassociation
// flags; the result differs from the prefill form only in summation order.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

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

void DecodeHead(const PagedAttentionArgs& a, int h, int64_t n_keys, std::vector<float>& q_rot,
                std::vector<float>& scores, std::vector<float>& acc) {
  const int d = a.shape.head_dim;
  const int kv_head = h / (a.num_heads / a.shape.num_kv_heads);
  const float* q = a.q + int64_t{h} * d;
  int64_t current_delta = -1;
  int64_t j = 0;
  float max_score = -std::numeric_limits<float>::infinity();
  for (int b = 0; b < a.num_blocks; ++b) {
    const KvBlockEntry e = a.block_table[b];
    const int64_t delta = KvEntryDelta(e);
    if (delta != current_delta) {  // once per segment: recompute from the original q
      std::copy(q, q + d, q_rot.begin());
      if (delta != 0) RopeRotateHeadCpu(q_rot.data(), -delta, *a.rope);
      current_delta = delta;
    }
    // A block's keys of one head are contiguous: [block_size][head_dim].
    const float* k = a.k_pool + a.shape.offset(KvEntryBlock(e), kv_head, 0);
    for (uint32_t s = 0; s < KvEntryValid(e); ++s, ++j) {
      scores[j] = Dot(q_rot.data(), k + int64_t{s} * d, d) * a.scale;
      max_score = std::max(max_score, scores[j]);
    }
  }
  double sum = 0;
  std::fill(acc.begin(), acc.end(), 0.0f);
  j = 0;
  for (int b = 0; b < a.num_blocks; ++b) {
    const KvBlockEntry e = a.block_table[b];
    const float* v = a.v_pool + a.shape.offset(KvEntryBlock(e), kv_head, 0);
    for (uint32_t s = 0; s < KvEntryValid(e); ++s, ++j) {
      const float p = std::exp(scores[j] - max_score);
      sum += p;
      Axpy(p, v + int64_t{s} * d, acc.data(), d);
    }
  }
  float* out = a.out + int64_t{h} * d;
  const float inv = n_keys > 0 ? static_cast<float>(1.0 / sum) : 0.0f;
  for (int x = 0; x < d; ++x) out[x] = acc[x] * inv;
}

}  // namespace

void PagedDecodeAttentionCpu(const PagedAttentionArgs& a) {
  const int d = a.shape.head_dim;
  int64_t n_keys = 0;
  for (int b = 0; b < a.num_blocks; ++b) n_keys += KvEntryValid(a.block_table[b]);
  // Short contexts stay on the calling thread (CpuWorkGrain).
  const int64_t grain = CpuWorkGrain(a.num_heads, 1, 2 * n_keys * d);
  CpuParallelFor(a.num_heads, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> q_rot(d), scores(n_keys), acc(d);
    for (int64_t h = begin; h < end; ++h) {
      DecodeHead(a, static_cast<int>(h), n_keys, q_rot, scores, acc);
    }
  });
}

}  // namespace lazyattn
