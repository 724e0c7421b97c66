#include "kernels/cuda/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"

namespace lazyattn {
namespace {

using testing::DeviceBuffer;

std::vector<int32_t> Sample(const std::vector<float>& logits, int rows, int vocab,
                            const std::vector<SamplingRowParams>& params) {
  DeviceBuffer<float> dl;
  dl.Upload(logits);
  DeviceBuffer<SamplingRowParams> dp;
  dp.Upload(params);
  DeviceBuffer<int32_t> out(rows);
  out.Poison();
  const absl::Status s = SampleTokensCuda(dl.get(), vocab, rows, vocab, dp.get(), out.get(), nullptr);
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return out.Download();
}

// The CPU sampler's argmax: first maximum (lowest id on ties).
int32_t CpuArgMax(const float* x, int n) { return int32_t(std::max_element(x, x + n) - x); }

// The set the CPU Sampler draws from (services/worker/engine/sampler.cc): scaled logits sorted by
// (value desc, id asc), top-k, then the smallest prefix reaching top_p. `margin` reports how far
// the nucleus boundary's cumulative probability is from top_p (rows too close to call are
// skipped by the membership test: the GPU sums in fixed point, the CPU in double).
std::vector<int32_t> CpuKeptSet(const float* x, int n, const SamplingRowParams& p,
                                double* margin) {
  const float inv_t = 1.0f / p.temperature;
  std::vector<std::pair<float, int32_t>> c(n);
  for (int i = 0; i < n; ++i) c[i] = {x[i] * inv_t, i};
  std::sort(c.begin(), c.end(), [](auto& a, auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  });
  size_t keep = (p.top_k > 0 && p.top_k < n) ? size_t(p.top_k) : size_t(n);
  std::vector<double> probs(keep);
  double sum = 0;
  for (size_t i = 0; i < keep; ++i) sum += probs[i] = std::exp(c[i].first - c[0].first);
  *margin = 1;
  if (p.top_p < 1) {
    double cum = 0;
    size_t k = 0;
    while (k < keep) {
      cum += probs[k++] / sum;
      if (cum >= p.top_p) break;
    }
    *margin = std::min(std::fabs(cum - p.top_p), std::fabs(cum - probs[k - 1] / sum - p.top_p));
    keep = k;
  }
  std::vector<int32_t> ids;
  for (size_t i = 0; i < keep; ++i) ids.push_back(c[i].second);
  return ids;
}

TEST(SamplingCudaTest, GreedyEqualsCpuArgmaxWithTies) {
  SKIP_WITHOUT_GPU();
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (int vocab : {1, 7, 1000, 128256}) {
    const int rows = 37;
    std::normal_distribution<float> normal(0, 3);
    std::vector<float> logits(size_t(rows) * vocab);
    for (auto& x : logits) x = normal(rng);
    // Ties at the maximum in some rows; bf16-like coarse values in others (many ties).
    std::uniform_int_distribution<int> id(0, vocab - 1);
    for (int r = 0; r < rows; ++r) {
      float* x = &logits[size_t(r) * vocab];
      if (r % 3 == 0) {
        const float top = *std::max_element(x, x + vocab) + 1.0f;
        for (int j = 0; j < 3; ++j) x[id(rng)] = top;
      } else if (r % 3 == 1) {
        for (int i = 0; i < vocab; ++i) x[i] = std::round(x[i] * 2) / 2;
      }
    }
    std::vector<SamplingRowParams> params(rows);
    for (int r = 0; r < rows; ++r) params[r].seed = r;
    // Greedy ignores top-k/top-p; temperature > 0 with top_k = 1 is greedy too.
    params[1].top_k = 5;
    params[2].temperature = 0.7f, params[2].top_k = 1;
    const auto got = Sample(logits, rows, vocab, params);
    for (int r = 0; r < rows; ++r) {
      ASSERT_EQ(got[r], CpuArgMax(&logits[size_t(r) * vocab], vocab)) << "vocab " << vocab
                                                                        << " row " << r;
    }
    // The many-CTA greedy argmax: the same ids, here with a row stride past the vocabulary.
    const int stride = vocab + 4;
    std::vector<float> padded(size_t(rows) * stride, 1e30f);  // never read: past the vocab
    for (int r = 0; r < rows; ++r) {
      std::copy_n(&logits[size_t(r) * vocab], vocab, &padded[size_t(r) * stride]);
    }
    DeviceBuffer<float> dl;
    dl.Upload(padded);
    DeviceBuffer<uint64_t> packed(rows);
    packed.Poison();
    ASSERT_TRUE(GreedyArgmaxCuda(dl.get(), stride, rows, vocab, packed.get(), nullptr).ok());
    const auto keys = packed.Download();
    for (int r = 0; r < rows; ++r) {
      ASSERT_EQ(GreedyIdFromPacked(keys[r]), CpuArgMax(&logits[size_t(r) * vocab], vocab))
          << "greedy argmax, vocab " << vocab << " row " << r;
    }
    // The same ids as a next step's input tokens, turned on the device (pipelined decode),
    // gathered from rows in another order (the next step may drop rows).
    std::vector<int32_t> source(rows);
    for (int r = 0; r < rows; ++r) source[r] = (r * 7 + 3) % rows;
    DeviceBuffer<int32_t> source_rows;
    source_rows.Upload(source);
    DeviceBuffer<int32_t> tokens(rows);
    tokens.Poison();
    ASSERT_TRUE(
        GreedyIdsToTokensCuda(packed.get(), source_rows.get(), rows, tokens.get(), nullptr).ok());
    const auto ids = tokens.Download();
    for (int r = 0; r < rows; ++r) {
      ASSERT_EQ(ids[r], GreedyIdFromPacked(keys[source[r]])) << "vocab " << vocab << " row " << r;
    }
  }
}

// Every draw lies in the CPU sampler's kept set (top-k with lowest-id ties, top-p prefix).
TEST(SamplingCudaTest, DrawsStayInsideTopKTopPSet) {
  SKIP_WITHOUT_GPU();
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const int vocab = 32000, rows = 128;
  std::normal_distribution<float> normal(0, 2);
  std::vector<float> logits(size_t(rows) * vocab);
  for (auto& x : logits) x = normal(rng);
  std::vector<SamplingRowParams> params(rows);
  const int ks[] = {0, 1, 2, 5, 50, 1000, 40000};
  const float ps[] = {1.0f, 0.9f, 0.5f, 0.1f, 0.99f};
  for (int r = 0; r < rows; ++r) {
    params[r].temperature = r % 2 ? 0.8f : 1.3f;
    params[r].top_k = ks[r % 7];
    params[r].top_p = ps[r % 5];
    params[r].seed = rng();
    params[r].offset = r;
    if (r % 4 == 0) {  // coarse logits: ties at the top-k and top-p boundaries
      for (int i = 0; i < vocab; ++i) logits[size_t(r) * vocab + i] = std::round(logits[size_t(r) * vocab + i]);
    }
  }
  for (int round = 0; round < 4; ++round) {
    for (auto& p : params) p.offset += 1000;
    const auto got = Sample(logits, rows, vocab, params);
    for (int r = 0; r < rows; ++r) {
      double margin = 0;
      const auto kept = CpuKeptSet(&logits[size_t(r) * vocab], vocab, params[r], &margin);
      if (margin < 1e-6) continue;
      ASSERT_NE(std::find(kept.begin(), kept.end(), got[r]), kept.end())
          << "row " << r << " top_k " << params[r].top_k << " top_p " << params[r].top_p
          << " drew " << got[r] << " outside a kept set of " << kept.size();
    }
  }
}

// Frequencies over many draws match the renormalized distribution of the kept set (within 5
// standard deviations per token; tokens outside the set never appear).
TEST(SamplingCudaTest, DrawFrequenciesMatchDistribution) {
  SKIP_WITHOUT_GPU();
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const int vocab = 12, rows = 200000;
  const std::vector<float> base = {1.0f, 2.5f, 0.3f, 2.5f, -1.0f, 3.0f, 0.0f, 1.7f, -3.0f, 2.2f,
                                   0.9f, 1.1f};
  SamplingRowParams p;
  p.temperature = 0.9f;
  p.top_k = 8;
  p.top_p = 0.9f;
  p.seed = rng();
  std::vector<float> logits(size_t(rows) * vocab);
  std::vector<SamplingRowParams> params(rows, p);
  for (int r = 0; r < rows; ++r) {
    std::copy(base.begin(), base.end(), &logits[size_t(r) * vocab]);
    params[r].offset = r;
  }
  const auto got = Sample(logits, rows, vocab, params);
  double margin = 0;
  const auto kept = CpuKeptSet(base.data(), vocab, p, &margin);
  ASSERT_GT(margin, 1e-3);
  std::vector<double> want(vocab, 0);
  double sum = 0;
  for (int id : kept) sum += want[id] = std::exp(base[id] / p.temperature);
  std::vector<int> count(vocab, 0);
  for (int id : got) {
    ASSERT_GE(id, 0);
    ASSERT_LT(id, vocab);
    ++count[id];
  }
  for (int id = 0; id < vocab; ++id) {
    const double pr = want[id] / sum;
    const double mean = pr * rows, sd = std::sqrt(rows * pr * (1 - pr));
    if (pr == 0) {
      EXPECT_EQ(count[id], 0) << "token " << id << " is outside the kept set";
    } else {
      EXPECT_NEAR(count[id], mean, 5 * sd + 1) << "token " << id;
    }
  }
}

}  // namespace
}  // namespace lazyattn
