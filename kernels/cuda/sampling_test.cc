#include "kernels/cuda/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/sampling_reference.h"
#include "kernels/cuda/cuda_test_util.h"

namespace lazyattn {
namespace {

using testing::DeviceBuffer;

struct Launch {
  std::vector<int32_t> ids;
  std::vector<float> logprobs;
};

// One SampleRowsCuda launch over `rows` rows of `vocab` logits.
Launch Sample(const std::vector<float>& logits, int vocab, const std::vector<SamplingRowParams>& params,
              const std::vector<PenaltyEntry>& penalties = {},
              const std::vector<int32_t>& input_tokens = {}) {
  const int rows = static_cast<int>(params.size());
  DeviceBuffer<float> dl;
  dl.Upload(logits);
  DeviceBuffer<SamplingRowParams> dp;
  dp.Upload(params);
  DeviceBuffer<PenaltyEntry> dpen;
  if (!penalties.empty()) dpen.Upload(penalties);
  DeviceBuffer<int32_t> din;
  if (!input_tokens.empty()) din.Upload(input_tokens);
  DeviceBuffer<int32_t> out(rows);
  out.Poison();
  DeviceBuffer<float> lp(rows);
  lp.Poison();
  const absl::Status s = SampleRowsCuda({.logits = dl.get(), .row_stride = vocab, .rows = rows,
                                         .vocab = vocab, .params = dp.get(),
                                         .penalties = dpen.get(),
                                         .input_tokens = din.get(), .out_ids = out.get(),
                                         .out_logprobs = lp.get()},
                                        nullptr);
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return {out.Download(), lp.Download()};
}

int32_t FirstMax(const float* x, int n) {  // NaN lowest, lowest id among equal maxima
  int best = -1;
  for (int i = 0; i < n; ++i) {
    if (std::isnan(x[i])) continue;
    if (best < 0 || x[i] > x[best]) best = i;
  }
  return best < 0 ? 0 : best;
}

// Host arithmetic only: 8 CTAs of 200 KB hold slices of up to 51,200 floats each.
TEST(SampleRowsCudaTest, TakesVocabulariesUpToWhatEightCtasHold) {
  EXPECT_TRUE(SampleRowsCudaSupports(1));
  EXPECT_TRUE(SampleRowsCudaSupports(128256));  // Llama 3
  EXPECT_TRUE(SampleRowsCudaSupports(262144));  // Gemma
  EXPECT_TRUE(SampleRowsCudaSupports(409600));
  EXPECT_FALSE(SampleRowsCudaSupports(409601));
  EXPECT_FALSE(SampleRowsCudaSupports(0));
  EXPECT_FALSE(SampleRowsCudaSupports(int64_t{1} << 40));
}

TEST(SampleRowsCudaTest, GreedyRowsAreTheArgmaxInMixedBatches) {
  SKIP_WITHOUT_GPU();
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "LAZYATTN_TEST_SEED=" << seed);
  std::mt19937 rng(seed);
  for (int vocab : {1, 7, 1000, 20001, 49152, 128256}) {
    SCOPED_TRACE(vocab);
    const int rows = 12;
    std::vector<float> x(size_t(rows) * vocab);
    std::normal_distribution<float> normal(0, 3);
    for (float& v : x) v = normal(rng);
    for (int r = 0; r < rows; ++r) {
      float* row = x.data() + size_t(r) * vocab;
      if (r % 3 == 1 && vocab > 2) {  // a tie for the maximum, and a NaN above everything
        const int a = int(rng() % vocab), b = int(rng() % vocab);
        row[a] = row[b] = 50.0f;
        row[int(rng() % vocab)] = NAN;
      }
    }
    std::vector<SamplingRowParams> params(rows);
    for (int r = 0; r < rows; ++r) {
      if (r % 2 == 1) params[r] = {.temperature = 0.8f, .top_p = 0.95f, .seed = uint64_t(r)};
      if (r % 4 == 2) params[r].flags = kSampleLogprob;
    }
    const Launch got = Sample(x, vocab, params);
    for (int r = 0; r < rows; ++r) {
      const float* row = x.data() + size_t(r) * vocab;
      ASSERT_GE(got.ids[r], 0) << "row " << r;
      ASSERT_LT(got.ids[r], vocab) << "row " << r;
      if (r % 2 == 0) {
        EXPECT_EQ(got.ids[r], FirstMax(row, vocab)) << "row " << r;
      }
      if (r % 4 == 2) {
        float lp = 0;
        SampleRowCpu(row, vocab, params[r], nullptr, 0, -1, &lp);
        EXPECT_NEAR(got.logprobs[r], lp, 1e-3) << "row " << r;
      }
    }
  }
}

// Many draws of one row (one per step, all in one launch): the empirical distribution must be
// the exact one, on small vocabularies (one draw group: the pick inside a group), with the ids
// 50 apart (two or three per group) and 3001 apart (one group each, over 8 CTAs).
TEST(SampleRowsCudaTest, DrawsMatchTheExactDistribution) {
  SKIP_WITHOUT_GPU();
  for (int spread : {1, 50, 3001}) {
    for (const testing::SamplingCase& c : testing::SamplingCases(spread)) {
      SCOPED_TRACE(c.name + " spread " + std::to_string(spread));
      const int vocab = int(c.logits.size());
      const auto probs = testing::ExactSamplingProbs(c.logits, c.params, c.penalties, c.input_token);
      const int rows = spread == 1 ? 20000 : 4000;
      std::vector<float> x(size_t(rows) * vocab);
      for (int r = 0; r < rows; ++r) std::copy(c.logits.begin(), c.logits.end(), x.begin() + size_t(r) * vocab);
      std::vector<SamplingRowParams> params(rows, c.params);
      for (int r = 0; r < rows; ++r) params[r].seed = 777, params[r].step = uint64_t(r);
      const Launch got =
          Sample(x, vocab, params, c.penalties, std::vector<int32_t>(rows, c.input_token));
      std::vector<int64_t> counts(vocab, 0);
      for (int32_t id : got.ids) {
        ASSERT_GE(id, 0);
        ASSERT_LT(id, vocab);
        ++counts[id];
      }
      EXPECT_EQ(testing::ChiSquareFailure(counts, probs), "");
    }
  }
}

// A row's draw depends on (seed, step, logits) only: the same on a second run and when the batch
// around it changes (other rows, other order, other batch size).
TEST(SampleRowsCudaTest, SeededDrawsRepeatAtAnyBatchComposition) {
  SKIP_WITHOUT_GPU();
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "LAZYATTN_TEST_SEED=" << seed);
  std::mt19937 rng(seed);
  const int vocab = 128256, rows = 32;
  std::vector<float> x(size_t(rows) * vocab);
  std::normal_distribution<float> normal(0, 2);
  for (float& v : x) v = normal(rng);
  std::vector<SamplingRowParams> params(rows);
  for (int r = 0; r < rows; ++r) {
    params[r] = {.temperature = 0.8f, .top_k = r % 3 == 0 ? 40 : 0, .top_p = 0.95f,
                 .min_p = r % 5 == 0 ? 0.05f : 0.0f, .seed = rng(), .step = uint64_t(r)};
  }
  const Launch a = Sample(x, vocab, params);
  const Launch b = Sample(x, vocab, params);
  EXPECT_EQ(a.ids, b.ids);
  // Reversed, and only every other row.
  std::vector<float> y;
  std::vector<SamplingRowParams> q;
  std::vector<int> from;
  for (int r = rows - 1; r >= 0; r -= 2) {
    y.insert(y.end(), x.begin() + size_t(r) * vocab, x.begin() + size_t(r + 1) * vocab);
    q.push_back(params[r]);
    from.push_back(r);
  }
  const Launch c = Sample(y, vocab, q);
  for (size_t i = 0; i < from.size(); ++i) EXPECT_EQ(c.ids[i], a.ids[from[i]]) << "row " << from[i];
  // Another seed or step draws differently somewhere.
  for (auto& p : params) ++p.step;
  const Launch d = Sample(x, vocab, params);
  EXPECT_NE(d.ids, a.ids);
}

// The CPU twin runs the same draw: on a full llama-3 vocabulary both backends pick the same
// token for nearly every (seed, step), and report the same log-probability (they differ only
// where float sums round differently at a cut), on flat (sigma 0.5), N(0, 2.5) and peaked
// (sigma 8) logits.
class SampleRowsCudaTwinTest : public ::testing::TestWithParam<float> {};
INSTANTIATE_TEST_SUITE_P(Spreads, SampleRowsCudaTwinTest, ::testing::Values(0.5f, 2.5f, 8.f));

TEST_P(SampleRowsCudaTwinTest, AgreesWithTheCpuTwin) {
  SKIP_WITHOUT_GPU();
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "LAZYATTN_TEST_SEED=" << seed);
  std::mt19937 rng(seed);
  const int vocab = 128256, rows = 48;
  std::vector<float> x(size_t(rows) * vocab);
  std::normal_distribution<float> normal(0, GetParam());
  for (float& v : x) v = normal(rng);
  std::vector<SamplingRowParams> params(rows);
  std::vector<PenaltyEntry> penalties;
  std::vector<int32_t> inputs(rows);
  for (int r = 0; r < rows; ++r) {
    SamplingRowParams& p = params[r];
    p = {.temperature = 0.8f, .top_p = 0.95f, .flags = kSampleLogprob, .seed = rng(),
         .step = uint64_t(rng() % 1000)};
    if (r % 4 == 1) p.top_k = 50;
    if (r % 4 == 2) p.min_p = 0.02f;
    if (r % 4 == 3) {
      p.repetition_penalty = 1.2f;
      p.frequency_penalty = 0.5f;
      p.penalty_begin = int32_t(penalties.size());
      for (int k = 0; k < 300; ++k) {
        // Distinct ids (the runner deduplicates; the kernel's contract).
        penalties.push_back({int32_t((k * 397 + r * 1009) % vocab), int32_t(k % 3), k % 2});
      }
      p.penalty_count = 300;
      p.flags |= kCountInputToken;
    }
    inputs[r] = int32_t(rng() % vocab);
  }
  const Launch got = Sample(x, vocab, params, penalties, inputs);
  int same = 0;
  for (int r = 0; r < rows; ++r) {
    float lp = 0;
    const SamplingRowParams& p = params[r];
    const int32_t want = SampleRowCpu(x.data() + size_t(r) * vocab, vocab, p,
                                      penalties.data() + p.penalty_begin, p.penalty_count,
                                      inputs[r], &lp);
    same += got.ids[r] == want;
    if (got.ids[r] == want) EXPECT_NEAR(got.logprobs[r], lp, 2e-3) << "row " << r;
  }
  EXPECT_GE(same, rows - 2) << same << " of " << rows << " rows drew the CPU's token";
}

TEST(SampleRowsCudaTest, RefusesBadShapes) {
  SKIP_WITHOUT_GPU();
  DeviceBuffer<float> x(8);
  DeviceBuffer<SamplingRowParams> p(1);
  DeviceBuffer<int32_t> out(1);
  EXPECT_FALSE(SampleRowsCuda({.logits = x.get(), .row_stride = 4, .rows = 1, .vocab = 8,
                               .params = p.get(), .out_ids = out.get()},
                              nullptr)
                   .ok());
  EXPECT_FALSE(SampleRowsCuda({.logits = x.get(), .row_stride = 1 << 20, .rows = 1,
                               .vocab = 1 << 20, .params = p.get(), .out_ids = out.get()},
                              nullptr)
                   .ok());
  EXPECT_FALSE(SampleRowsCuda({.logits = nullptr, .row_stride = 8, .rows = 1, .vocab = 8,
                               .params = p.get(), .out_ids = out.get()},
                              nullptr)
                   .ok());
}

// The many-CTA greedy argmax of all-greedy steps (row stride past the vocabulary), and both
// id-to-token gathers of pipelined decode, from rows in another order.
TEST(SampleRowsCudaTest, GreedyArgmaxAndTokenGathers) {
  SKIP_WITHOUT_GPU();
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "LAZYATTN_TEST_SEED=" << seed);
  std::mt19937 rng(seed);
  for (int vocab : {1, 7, 1000, 128256}) {
    const int rows = 37, stride = vocab + 4;
    std::normal_distribution<float> normal(0, 3);
    std::vector<float> padded(size_t(rows) * stride, 1e30f);  // past the vocab: never read
    for (int r = 0; r < rows; ++r) {
      float* x = &padded[size_t(r) * stride];
      for (int i = 0; i < vocab; ++i) x[i] = std::round(normal(rng) * 2) / 2;  // many ties
    }
    DeviceBuffer<float> dl;
    dl.Upload(padded);
    DeviceBuffer<uint64_t> packed(rows);
    packed.Poison();
    ASSERT_TRUE(GreedyArgmaxCuda(dl.get(), stride, rows, vocab, packed.get(), nullptr).ok());
    const auto keys = packed.Download();
    std::vector<int32_t> want(rows);
    for (int r = 0; r < rows; ++r) {
      want[r] = FirstMax(&padded[size_t(r) * stride], vocab);
      ASSERT_EQ(GreedyIdFromPacked(keys[r]), want[r]) << "vocab " << vocab << " row " << r;
    }
    std::vector<int32_t> source(rows);
    for (int r = 0; r < rows; ++r) source[r] = (r * 7 + 3) % rows;
    DeviceBuffer<int32_t> source_rows, ids, tokens(rows), tokens2(rows);
    source_rows.Upload(source);
    ids.Upload(want);
    tokens.Poison();
    tokens2.Poison();
    ASSERT_TRUE(
        GreedyIdsToTokensCuda(packed.get(), source_rows.get(), rows, tokens.get(), nullptr).ok());
    ASSERT_TRUE(
        SampledIdsToTokensCuda(ids.get(), source_rows.get(), rows, tokens2.get(), nullptr).ok());
    const auto t1 = tokens.Download(), t2 = tokens2.Download();
    for (int r = 0; r < rows; ++r) {
      ASSERT_EQ(t1[r], want[source[r]]) << "vocab " << vocab << " row " << r;
      ASSERT_EQ(t2[r], want[source[r]]) << "vocab " << vocab << " row " << r;
    }
  }
}

}  // namespace
}  // namespace lazyattn
