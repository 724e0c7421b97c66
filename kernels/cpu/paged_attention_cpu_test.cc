#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/half_rows.h"
#include "kernels/include/cpu_threads.h"
#include "kernels/include/paged_attention.h"

namespace lazyattn {
namespace {

// A request built of segments (documents, then the query's own tokens), each starting on a fresh
// block, stored the way the engine stores them: K rotated at segment-local positions.
struct Segment {
  int length;
};

struct Scenario {
  int num_heads, num_kv_heads, head_dim;
  std::vector<Segment> segments;
  int num_queries;  // the last `num_queries` tokens of the last segment are the queries
};

// Reference: plain causal attention over the whole sequence with K rotated at GLOBAL positions.
void DenseReference(const std::vector<float>& q_global, const std::vector<float>& k_global,
                    const std::vector<float>& v, int total, int first_query, int nq, int H, int KH,
                    int d, std::vector<float>& out) {
  out.assign(size_t(nq) * H * d, 0);
  for (int i = 0; i < nq; ++i) {
    for (int h = 0; h < H; ++h) {
      const int kh = h / (H / KH);
      std::vector<double> s(first_query + i + 1);
      double mx = -1e300;
      for (int j = 0; j <= first_query + i; ++j) {
        double dot = 0;
        for (int x = 0; x < d; ++x)
          dot += double{q_global[(size_t(i) * H + h) * d + x]} * k_global[(size_t(j) * KH + kh) * d + x];
        s[j] = dot / std::sqrt(double(d));
        mx = std::max(mx, s[j]);
      }
      double sum = 0;
      for (double& x : s) sum += (x = std::exp(x - mx));
      for (int j = 0; j <= first_query + i; ++j)
        for (int x = 0; x < d; ++x)
          out[(size_t(i) * H + h) * d + x] += s[j] / sum * v[(size_t(j) * KH + kh) * d + x];
    }
  }
}

void RunScenario(const Scenario& sc, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0, 1);
  const int H = sc.num_heads, KH = sc.num_kv_heads, d = sc.head_dim, B = kDefaultKvBlockSize;
  int total = 0;
  for (auto& s : sc.segments) total += s.length;
  RopeTable rope(RopeParams{.head_dim = d, .theta = 10000}, total + 1);

  std::vector<float> k_raw(size_t(total) * KH * d), v(size_t(total) * KH * d),
      q_raw(size_t(sc.num_queries) * H * d);
  for (float& x : k_raw) x = dist(rng);
  for (float& x : v) x = dist(rng);
  for (float& x : q_raw) x = dist(rng);

  // Paged storage with shuffled physical blocks: K rotated at local positions.
  PagedKvShape shape{.num_kv_heads = KH, .head_dim = d, .block_size = B};
  int num_blocks = 0;
  for (auto& s : sc.segments) num_blocks += (s.length + B - 1) / B;
  std::vector<uint32_t> physical(num_blocks);
  for (int i = 0; i < num_blocks; ++i) physical[i] = i;
  std::shuffle(physical.begin(), physical.end(), rng);
  std::vector<float> k_pool(num_blocks * shape.block_stride(), NAN),
      v_pool(num_blocks * shape.block_stride(), NAN);
  std::vector<KvBlockEntry> table;
  std::vector<float> k_global = k_raw;
  int token = 0, logical = 0;
  for (auto& s : sc.segments) {
    const int delta = token;
    for (int local = 0; local < s.length; ++local, ++token) {
      std::vector<float> k_local(&k_raw[size_t(token) * KH * d], &k_raw[size_t(token + 1) * KH * d]);
      for (int h = 0; h < KH; ++h) {
        RopeRotateHeadCpu(&k_local[h * d], local, rope);
        RopeRotateHeadCpu(&k_global[(size_t(token) * KH + h) * d], token, rope);
      }
      const int64_t slot = int64_t{physical[logical + local / B]} * B + local % B;
      PagedKvWriteCpu(k_local.data(), &v[size_t(token) * KH * d], 1, &slot, shape, k_pool.data(),
                      v_pool.data());
    }
    for (int b = 0; b < (s.length + B - 1) / B; ++b) {
      const int valid = std::min(B, s.length - b * B);
      table.push_back(PackKvBlockEntry(physical[logical + b], delta, valid));
    }
    logical += (s.length + B - 1) / B;
  }
  const int first_query = total - sc.num_queries;
  std::vector<float> q_global = q_raw;
  for (int i = 0; i < sc.num_queries; ++i)
    for (int h = 0; h < H; ++h) RopeRotateHeadCpu(&q_global[(size_t(i) * H + h) * d], first_query + i, rope);

  std::vector<float> out(q_global.size(), NAN);
  PagedAttentionCpu({.q = q_global.data(), .num_queries = sc.num_queries, .num_heads = H,
                     .first_query_index = first_query, .block_table = table.data(),
                     .num_blocks = static_cast<int>(table.size()), .k_pool = k_pool.data(),
                     .v_pool = v_pool.data(), .shape = shape, .scale = 1.0f / std::sqrt(float(d)),
                     .rope = &rope, .out = out.data()});
  std::vector<float> ref;
  DenseReference(q_global, k_global, v, total, first_query, sc.num_queries, H, KH, d, ref);
  for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], ref[i], 2e-4) << "element " << i;
  if (sc.num_queries == 1) {
    // The decode schedule (query rotated backward once per segment) computes the same function.
    std::vector<float> dec(q_global.size(), NAN);
    PagedDecodeAttentionCpu({.q = q_global.data(), .num_queries = 1, .num_heads = H,
                             .first_query_index = first_query, .block_table = table.data(),
                             .num_blocks = static_cast<int>(table.size()),
                             .k_pool = k_pool.data(), .v_pool = v_pool.data(), .shape = shape,
                             .scale = 1.0f / std::sqrt(float(d)), .rope = &rope,
                             .out = dec.data()});
    for (size_t i = 0; i < dec.size(); ++i) ASSERT_NEAR(dec[i], ref[i], 2e-4) << "decode " << i;
  }

  // The same pools stored as IEEE half (an F16 KV cache) against the fp32 pools. Each stored
  // value moves by at most u = 2^-11 of itself, so a score q.k * scale by at most
  // u * scale * |q| |k|, which moves softmax-weighted outputs by at most twice that times max |v|
  // (to first order; 10% for the rest), and the values' own rounding adds u * max |v|.
  auto max_row_norm = [d](const std::vector<float>& m) {
    double best = 0;
    for (size_t r = 0; r + d <= m.size(); r += d) {
      double n2 = 0;
      for (int x = 0; x < d; ++x) n2 += double(m[r + x]) * m[r + x];
      best = std::max(best, std::sqrt(n2));
    }
    return best;
  };
  double max_v = 0;
  for (float x : v) max_v = std::max(max_v, double(std::abs(x)));
  const double u = std::ldexp(1.0, -11), scale = 1.0 / std::sqrt(double(d));
  const double bound =
      max_v * u * (2.2 * scale * max_row_norm(q_global) * max_row_norm(k_raw) + 1) + 1e-5;
  std::vector<uint16_t> k16(k_pool.size()), v16(v_pool.size());
  cpu_internal::FloatToHalfRow(k_pool.data(), int64_t(k_pool.size()), k16.data());
  cpu_internal::FloatToHalfRow(v_pool.data(), int64_t(v_pool.size()), v16.data());
  PagedAttentionArgs half_args{.q = q_global.data(), .num_queries = sc.num_queries,
                               .num_heads = H, .first_query_index = first_query,
                               .block_table = table.data(),
                               .num_blocks = static_cast<int>(table.size()), .shape = shape,
                               .scale = 1.0f / std::sqrt(float(d)), .rope = &rope,
                               .k_pool_f16 = k16.data(), .v_pool_f16 = v16.data()};
  std::vector<float> out16(q_global.size(), NAN);
  half_args.out = out16.data();
  PagedAttentionCpu(half_args);
  double worst = 0;
  for (size_t i = 0; i < out16.size(); ++i) {
    ASSERT_NEAR(out16[i], out[i], bound) << "f16 element " << i;
    worst = std::max(worst, double(std::abs(out16[i] - out[i])));
  }
  EXPECT_GT(worst, 0.0) << "the f16 pools were not read";
  if (sc.num_queries == 1) {
    std::vector<float> dec16(q_global.size(), NAN);
    half_args.out = dec16.data();
    PagedDecodeAttentionCpu(half_args);
    for (size_t i = 0; i < dec16.size(); ++i)
      ASSERT_NEAR(dec16[i], out[i], bound + 2e-4) << "f16 decode " << i;
  }
}

TEST(PagedAttentionCpuTest, SingleSegmentCausalPrefill) {
  RunScenario({.num_heads = 4, .num_kv_heads = 2, .head_dim = 16, .segments = {{37}},
               .num_queries = 37}, 1);
}

TEST(PagedAttentionCpuTest, DeferredRotationEqualsGlobalRotation) {
  // Documents of odd lengths with partial last blocks, then a question; queries cover several
  // chunks of the CPU implementation.
  RunScenario({.num_heads = 8, .num_kv_heads = 2, .head_dim = 32,
               .segments = {{1}, {17}, {100}, {7}, {16}, {200}}, .num_queries = 150}, 2);
}

TEST(PagedAttentionCpuTest, PrefillChunksOverMoreThreadsThanCores) {
  // Five query chunks of three query heads per KV head, handed out over three threads (more than
  // this box's cores, so they interleave); GQA, an odd head_dim, a partial last chunk.
  SetCpuKernelThreads(3);
  RunScenario({.num_heads = 6, .num_kv_heads = 2, .head_dim = 24,
               .segments = {{45}, {130}, {530}}, .num_queries = 530}, 7);
  SetCpuKernelThreads(0);
}

TEST(PagedAttentionCpuTest, DecodeRangesEvenedOverThreads) {
  // Three threads: 2 KV heads x 21 blocks take three ranges of 7 blocks (six tasks, not four);
  // 1 KV head x 5 blocks over four threads takes four ranges of 2, 2, 1 and none.
  SetCpuKernelThreads(3);
  RunScenario({.num_heads = 6, .num_kv_heads = 2, .head_dim = 32,
               .segments = {{150}, {170}}, .num_queries = 1}, 8);
  SetCpuKernelThreads(4);
  RunScenario({.num_heads = 3, .num_kv_heads = 1, .head_dim = 16,
               .segments = {{40}, {30}}, .num_queries = 1}, 9);
  SetCpuKernelThreads(0);
}

TEST(PagedAttentionCpuTest, DecodeSingleQuery) {
  RunScenario({.num_heads = 4, .num_kv_heads = 4, .head_dim = 64,
               .segments = {{33}, {16}, {5}}, .num_queries = 1}, 3);
}

TEST(PagedAttentionCpuTest, DecodeOverThreadsWithGqaAndOddHeadDim) {
  // Enough work for the decode form to split its heads over the kernel threads; a head_dim that
  // is not a multiple of 8 leaves a tail after the eight partial sums.
  RunScenario({.num_heads = 6, .num_kv_heads = 2, .head_dim = 20,
               .segments = {{300}, {17}, {400}}, .num_queries = 1}, 6);
}

TEST(PagedAttentionCpuTest, DeltaBeyondSixteenBits) {
  // A document placed after 70,000 tokens: deltas must not be truncated to 16 bits.
  RunScenario({.num_heads = 2, .num_kv_heads = 1, .head_dim = 16,
               .segments = {{70000}, {20}, {3}}, .num_queries = 3}, 4);
}

TEST(PagedAttentionCpuTest, DecodeScheduleAtLargeOffsets) {
  RunScenario({.num_heads = 4, .num_kv_heads = 2, .head_dim = 16,
               .segments = {{66000}, {40}, {1}}, .num_queries = 1}, 5);
}

TEST(KvBlockEntryTest, PacksAndUnpacksFullRanges) {
  const KvBlockEntry e = PackKvBlockEntry(0xfffffffe, kMaxKvDelta, 255);
  EXPECT_EQ(KvEntryBlock(e), 0xfffffffeu);
  EXPECT_EQ(KvEntryDelta(e), kMaxKvDelta);
  EXPECT_EQ(KvEntryValid(e), 255u);
  const KvBlockEntry f = PackKvBlockEntry(7, 131072, 16);
  EXPECT_EQ(KvEntryBlock(f), 7u);
  EXPECT_EQ(KvEntryDelta(f), 131072u);
  EXPECT_EQ(KvEntryValid(f), 16u);
}

}  // namespace
}  // namespace lazyattn
