// The prefill form of paged attention (paged_attention.h): each KV head's visible keys and values
// are copied out of the pool (keys rotated by their block's delta) into contiguous matrices, then
// every (query head, chunk of queries) pair is one BLAS task: scores = q k^T, a softmax, out = p v.
//
// Tasks run on the kernel threads (cpu_threads.h), handed out largest first from a shared counter,
// so the causal chunks' unequal sizes and a core slowed by another process still balance. On a
// 512-token SmolLM2 prefill this phase was 27% of the time on one thread.
#include <cblas.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/half_rows.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/include/cpu_threads.h"
#include "kernels/include/paged_attention.h"

namespace lazyattn {
namespace {

// Queries are processed in chunks so the score matrix stays small for 100K-token prompts.
constexpr int kQueryChunk = 128;

// Copies the visible keys of one KV head out of the pool into a contiguous [n][d] matrix (widened
// to fp32 from an F16 pool), rotating each block's keys forward by the block's delta, and its
// values likewise (unrotated).
void GatherKv(const PagedAttentionArgs& a, int kv_head, int64_t n_keys, float* k, float* v) {
  const int d = a.shape.head_dim;
  int64_t row = 0;
  for (int b = 0; b < a.num_blocks && row < n_keys; ++b) {
    const KvBlockEntry e = a.block_table[b];
    const uint32_t delta = KvEntryDelta(e);
    const int take = static_cast<int>(std::min<int64_t>(KvEntryValid(e), n_keys - row));
    const int64_t off = a.shape.offset(KvEntryBlock(e), kv_head, 0);
    // A block's rows of one head are contiguous ([block_size][head_dim]).
    if (a.k_pool_f16 != nullptr) {
      cpu_internal::HalfToFloatRow(a.k_pool_f16 + off, int64_t{take} * d, k + row * d);
      cpu_internal::HalfToFloatRow(a.v_pool_f16 + off, int64_t{take} * d, v + row * d);
    } else {
      std::memcpy(k + row * d, a.k_pool + off, int64_t{take} * d * sizeof(float));
      std::memcpy(v + row * d, a.v_pool + off, int64_t{take} * d * sizeof(float));
    }
    if (delta != 0) {
      for (int s = 0; s < take; ++s) RopeRotateHeadCpu(k + (row + s) * d, delta, *a.rope);
    }
    row += take;
  }
}

// Query head h, queries [q0, q0 + nq) against the first keys of its KV head's k / v ([n][d]).
void AttendChunk(const PagedAttentionArgs& a, int h, int q0, int nq, int64_t n_keys, const float* k,
                 const float* v, std::vector<float>& scores) {
  const int d = a.shape.head_dim;
  const int64_t q_stride = int64_t{a.num_heads} * d;
  float* out = a.out + q0 * q_stride + int64_t{h} * d;
  // Keys past the chunk's last query are masked for every row: skip them.
  const int64_t nk = std::min(n_keys, a.first_query_index + q0 + nq);
  if (nk <= 0) {
    for (int i = 0; i < nq; ++i) std::fill_n(out + i * q_stride, d, 0.0f);
    return;
  }
  scores.resize(nq * nk);
  const float* q = a.q + q0 * q_stride + int64_t{h} * d;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nq, nk, d, a.scale, q, q_stride, k, d, 0.0f,
              scores.data(), nk);
  for (int i = 0; i < nq; ++i) {
    float* row = &scores[i * nk];
    const int64_t visible = std::min(nk, a.first_query_index + q0 + i + 1);
    float max_score = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < visible; ++j) max_score = std::max(max_score, row[j]);
    const double sum = cpu_internal::ExpShiftSum(row, visible, max_score);
    const float inv = static_cast<float>(1.0 / sum);
    for (int64_t j = 0; j < visible; ++j) row[j] *= inv;
    std::fill(row + visible, row + nk, 0.0f);
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nq, d, nk, 1.0f, scores.data(), nk, v, d,
              0.0f, out, q_stride);
}

}  // namespace

void PagedAttentionCpu(const PagedAttentionArgs& a) {
  if (a.num_queries <= 0) return;
  const int d = a.shape.head_dim;
  const int kv_heads = a.shape.num_kv_heads;
  const int group = a.num_heads / kv_heads;
  int64_t total_keys = 0;
  for (int b = 0; b < a.num_blocks; ++b) total_keys += KvEntryValid(a.block_table[b]);
  // The last query sees keys up to its own sequence index; later keys are never read.
  const int64_t n_keys =
      std::max<int64_t>(0, std::min(total_keys, a.first_query_index + a.num_queries));
  const int chunks = (a.num_queries + kQueryChunk - 1) / kQueryChunk;

  // One KV head's keys and values at a time bound the copy at 2 n d floats (100K keys, d = 128:
  // 100 MB) whatever the head count; its query heads and chunks are the parallel tasks.
  std::vector<float> k(n_keys * d), v(n_keys * d);
  const int64_t tasks = int64_t{group} * chunks;
  const int64_t work_per_task =
      2 * int64_t{std::min(kQueryChunk, a.num_queries)} * std::max<int64_t>(n_keys, 1) * d;
  const int ranges = static_cast<int>(
      std::min<int64_t>(CpuKernelThreads(), tasks / CpuWorkGrain(tasks, 1, work_per_task)));
  for (int kv_head = 0; kv_head < kv_heads; ++kv_head) {
    GatherKv(a, kv_head, n_keys, k.data(), v.data());
    std::atomic<int64_t> next{0};
    CpuParallelFor(std::max(ranges, 1), 1, [&](int64_t, int64_t) {
      std::vector<float> scores;
      // Largest chunks (the last: they see the most keys) first, each thread taking the next.
      for (int64_t t; (t = next.fetch_add(1, std::memory_order_relaxed)) < tasks;) {
        const int c = chunks - 1 - static_cast<int>(t / group);
        const int h = kv_head * group + static_cast<int>(t % group);
        const int q0 = c * kQueryChunk;
        AttendChunk(a, h, q0, std::min(kQueryChunk, a.num_queries - q0), n_keys, k.data(), v.data(),
                    scores);
      }
    });
  }
}

namespace {

// Stores one row of d values into a pool of either element type: fp32 as is, half rounded.
void StoreRow(const float* src, int d, float* dst) { std::memcpy(dst, src, d * sizeof(float)); }
void StoreRow(const float* src, int d, uint16_t* dst) { cpu_internal::FloatToHalfRow(src, d, dst); }

template <typename T>
void KvWrite(const float* k, const float* v, int n, const int64_t* slots, const PagedKvShape& shape,
             T* k_pool, T* v_pool) {
  const int d = shape.head_dim;
  for (int t = 0; t < n; ++t) {
    const uint32_t block = static_cast<uint32_t>(slots[t] / shape.block_size);
    const int slot = static_cast<int>(slots[t] % shape.block_size);
    for (int h = 0; h < shape.num_kv_heads; ++h) {
      const int64_t src = (int64_t{t} * shape.num_kv_heads + h) * d;
      const int64_t dst = shape.offset(block, h, slot);
      StoreRow(k + src, d, k_pool + dst);
      StoreRow(v + src, d, v_pool + dst);
    }
  }
}

}  // namespace

void PagedKvWriteCpu(const float* k, const float* v, int n, const int64_t* slots,
                     const PagedKvShape& shape, float* k_pool, float* v_pool) {
  KvWrite(k, v, n, slots, shape, k_pool, v_pool);
}

void PagedKvWriteCpu(const float* k, const float* v, int n, const int64_t* slots,
                     const PagedKvShape& shape, uint16_t* k_pool, uint16_t* v_pool) {
  KvWrite(k, v, n, slots, shape, k_pool, v_pool);
}

}  // namespace lazyattn
