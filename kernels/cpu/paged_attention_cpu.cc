#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/include/paged_attention.h"

namespace lazyattn {
namespace {

// Queries are processed in chunks so the score matrix stays small for 100K-token prompts.
constexpr int kQueryChunk = 128;

// Copies the visible keys of one KV head out of the pool into a contiguous [n][d] matrix, rotating
// each block's keys forward by the block's delta, and its values likewise (unrotated).
void GatherKv(const PagedAttentionArgs& a, int kv_head, int64_t n_keys, std::vector<float>& k,
              std::vector<float>& v) {
  const int d = a.shape.head_dim;
  k.resize(n_keys * d);
  v.resize(n_keys * d);
  int64_t row = 0;
  for (int b = 0; b < a.num_blocks && row < n_keys; ++b) {
    const KvBlockEntry e = a.block_table[b];
    const uint32_t delta = KvEntryDelta(e);
    const int take = static_cast<int>(std::min<int64_t>(KvEntryValid(e), n_keys - row));
    for (int s = 0; s < take; ++s, ++row) {
      const int64_t off = a.shape.offset(KvEntryBlock(e), kv_head, s);
      std::memcpy(&k[row * d], a.k_pool + off, d * sizeof(float));
      std::memcpy(&v[row * d], a.v_pool + off, d * sizeof(float));
      if (delta != 0) RopeRotateHeadCpu(&k[row * d], delta, *a.rope);
    }
  }
}

}  // namespace

void PagedAttentionCpu(const PagedAttentionArgs& a) {
  const int d = a.shape.head_dim;
  const int group = a.num_heads / a.shape.num_kv_heads;
  const int64_t q_stride = int64_t{a.num_heads} * d;
  int64_t total_keys = 0;
  for (int b = 0; b < a.num_blocks; ++b) total_keys += KvEntryValid(a.block_table[b]);
  // The last query sees keys up to its own sequence index; later keys are never read.
  const int64_t n_keys = std::min(total_keys, a.first_query_index + a.num_queries);

  std::vector<float> k, v, scores;
  for (int kv_head = 0; kv_head < a.shape.num_kv_heads; ++kv_head) {
    GatherKv(a, kv_head, n_keys, k, v);
    for (int h = kv_head * group; h < (kv_head + 1) * group; ++h) {
      for (int q0 = 0; q0 < a.num_queries; q0 += kQueryChunk) {
        const int nq = std::min(kQueryChunk, a.num_queries - q0);
        // Keys past the chunk's last query are masked for every row: skip them.
        const int64_t nk = std::min(n_keys, a.first_query_index + q0 + nq);
        if (nk <= 0) {
          for (int i = 0; i < nq; ++i) {
            std::fill_n(a.out + (q0 + i) * q_stride + int64_t{h} * d, d, 0.0f);
          }
          continue;
        }
        scores.assign(nq * nk, 0.0f);
        const float* q = a.q + q0 * q_stride + int64_t{h} * d;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nq, nk, d, a.scale, q, q_stride,
                    k.data(), d, 0.0f, scores.data(), nk);
        for (int i = 0; i < nq; ++i) {
          float* row = &scores[i * nk];
          const int64_t visible = std::min(nk, a.first_query_index + q0 + i + 1);
          float max_score = -std::numeric_limits<float>::infinity();
          for (int64_t j = 0; j < visible; ++j) max_score = std::max(max_score, row[j]);
          double sum = 0;
          for (int64_t j = 0; j < visible; ++j) {
            row[j] = std::exp(row[j] - max_score);
            sum += row[j];
          }
          const float inv = static_cast<float>(1.0 / sum);
          for (int64_t j = 0; j < visible; ++j) row[j] *= inv;
          std::fill(row + visible, row + nk, 0.0f);
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nq, d, nk, 1.0f, scores.data(), nk,
                    v.data(), d, 0.0f, a.out + q0 * q_stride + int64_t{h} * d, q_stride);
      }
    }
  }
}

void PagedKvWriteCpu(const float* k, const float* v, int n, const int64_t* slots,
                     const PagedKvShape& shape, float* k_pool, float* v_pool) {
  const int d = shape.head_dim;
  for (int t = 0; t < n; ++t) {
    const uint32_t block = static_cast<uint32_t>(slots[t] / shape.block_size);
    const int slot = static_cast<int>(slots[t] % shape.block_size);
    for (int h = 0; h < shape.num_kv_heads; ++h) {
      const int64_t src = (int64_t{t} * shape.num_kv_heads + h) * d;
      const int64_t dst = shape.offset(block, h, slot);
      std::memcpy(k_pool + dst, k + src, d * sizeof(float));
      std::memcpy(v_pool + dst, v + src, d * sizeof(float));
    }
  }
}

}  // namespace lazyattn
