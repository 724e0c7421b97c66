#include <cmath>
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/sampling_reference.h"
#include "kernels/include/sampling.h"

namespace lazyattn {
namespace {

TEST(SamplingCpuTest, DrawsMatchTheExactDistribution) {
  for (int spread : {1, 37, 300}) {  // one draw group; 3-4 ids a group; one id a group
    for (const testing::SamplingCase& c : testing::SamplingCases(spread)) {
      SCOPED_TRACE(c.name + " spread " + std::to_string(spread));
      const auto probs = testing::ExactSamplingProbs(c.logits, c.params, c.penalties, c.input_token);
      std::vector<int64_t> counts(c.logits.size(), 0);
      SamplingRowParams p = c.params;
      p.seed = 12345;
      for (uint64_t step = 0; step < (spread == 1 ? 20000u : 8000u); ++step) {
        p.step = step;
        const int32_t id = SampleRowCpu(c.logits.data(), int32_t(c.logits.size()), p,
                                        c.penalties.data(), int32_t(c.penalties.size()),
                                        c.input_token);
        ASSERT_GE(id, 0);
        ASSERT_LT(id, int32_t(c.logits.size()));
        ++counts[id];
      }
      EXPECT_EQ(testing::ChiSquareFailure(counts, probs), "");
    }
  }
}

TEST(SamplingCpuTest, GreedyIsTheFirstMaximumAndSeedsRepeat) {
  const std::vector<float> x = {1.0f, 3.0f, NAN, 3.0f, -2.0f};
  SamplingRowParams greedy;
  EXPECT_EQ(SampleRowCpu(x.data(), 5, greedy, nullptr, 0, -1), 1);
  SamplingRowParams p{.temperature = 1.0f, .seed = 99, .step = 4};
  const int32_t a = SampleRowCpu(x.data(), 5, p, nullptr, 0, -1);
  EXPECT_EQ(SampleRowCpu(x.data(), 5, p, nullptr, 0, -1), a);
  EXPECT_NE(a, 2);  // NaN is never drawn
  float lp = 0;
  SampleRowCpu(x.data(), 5, greedy, nullptr, 0, -1, &lp);
  // log softmax at id 1 with NaN as -inf: 3 - log(e^1 + 2 e^3 + e^-2)
  EXPECT_NEAR(lp, 3.0 - std::log(std::exp(1.0) + 2 * std::exp(3.0) + std::exp(-2.0)), 1e-5);
}

// Below kMinSamplingTemperature the row is the greedy row, whatever the seed: denormal and tiny
// positive temperatures (1/T overflows to inf under 2.9e-39) as well as ones just under the
// threshold. At the threshold the row samples: two equal maxima are both drawn.
TEST(SamplingCpuTest, TemperaturesBelowTheThresholdAreGreedy) {
  const std::vector<float> x = {0.0f, -1.0f, 2.5f, 2.4999f, 0.0f, 1.0f};
  const int32_t v = int32_t(x.size());
  for (float t : {1.4e-45f, 1e-40f, 1e-38f, 1e-20f, 0.5f * kMinSamplingTemperature,
                  std::nextafter(kMinSamplingTemperature, 0.0f)}) {
    SCOPED_TRACE(t);
    SamplingRowParams p{.temperature = t, .flags = kSampleLogprob, .seed = 5};
    EXPECT_TRUE(SamplingIsGreedy(p));
    for (uint64_t step = 0; step < 200; ++step) {
      p.step = step;
      float lp = 0;
      ASSERT_EQ(SampleRowCpu(x.data(), v, p, nullptr, 0, -1, &lp), 2);
      EXPECT_TRUE(std::isfinite(lp));
    }
  }
  const std::vector<float> tie = {1.0f, 1.0f};
  SamplingRowParams p{.temperature = kMinSamplingTemperature, .seed = 5};
  EXPECT_FALSE(SamplingIsGreedy(p));
  int drawn[2] = {0, 0};
  for (uint64_t step = 0; step < 200; ++step) {
    p.step = step;
    ++drawn[SampleRowCpu(tie.data(), 2, p, nullptr, 0, -1)];
  }
  EXPECT_GT(drawn[0], 0);
  EXPECT_GT(drawn[1], 0);
}

// The bias is added first and the penalties act on the biased logit (vLLM's order), written out
// by hand rather than through PenalizedLogit, which the reference above shares.
TEST(SamplingCpuTest, LogitBiasComesBeforeThePenalties) {
  const SamplingRowParams p{.repetition_penalty = 2.0f,
                            .presence_penalty = 0.5f,
                            .frequency_penalty = 0.25f,
                            .flags = kLogitBias};
  // In the prompt: (2 + 2) / 2 = 2 (the other order would give 2 / 2 + 2 = 3).
  EXPECT_EQ(PenalizedLogit(2.0f, p, PenaltyEntry{.id = 0, .in_prompt = 1, .bias = 2.0f}), 2.0f);
  // Bias turns the logit negative, so the repetition penalty multiplies: (1 - 3) * 2 = -4, then
  // two output occurrences: -4 - (2 * 0.25 + 0.5) = -5.
  EXPECT_EQ(PenalizedLogit(1.0f, p, PenaltyEntry{.id = 0, .output_count = 1, .bias = -3.0f}, 1),
            -5.0f);
  // A bias-only entry of a row with no penalties: just the sum.
  const SamplingRowParams bias_only{.flags = kLogitBias};
  EXPECT_EQ(PenalizedLogit(-1.5f, bias_only, PenaltyEntry{.id = 0, .bias = 100.0f}), 98.5f);
  EXPECT_TRUE(AdjustsLogits(bias_only));
  EXPECT_FALSE(HasPenalties(bias_only));
}

TEST(SamplingCpuTest, LogitBiasBansAndForcesTokens) {
  const std::vector<float> x = {1.0f, 5.0f, 2.0f, -3.0f};
  SamplingRowParams greedy{.flags = kLogitBias};
  const std::vector<PenaltyEntry> ban = {{.id = 1, .bias = -100.0f}};
  EXPECT_EQ(SampleRowCpu(x.data(), 4, greedy, ban.data(), 1, -1), 2);
  const std::vector<PenaltyEntry> force = {{.id = 3, .bias = 100.0f}};
  EXPECT_EQ(SampleRowCpu(x.data(), 4, greedy, force.data(), 1, -1), 3);
  // Without the flag the entries' biases are not applied (a penalty-free row ignores its list).
  SamplingRowParams no_flag;
  EXPECT_EQ(SampleRowCpu(x.data(), 4, no_flag, force.data(), 1, -1), 1);
  // Sampled at T 1: +100 on id 3 leaves the others e^-95 or less of its mass; the logprob is the
  // biased softmax's.
  SamplingRowParams hot{.temperature = 1.0f, .flags = kLogitBias | kSampleLogprob, .seed = 3};
  for (uint64_t step = 0; step < 100; ++step) {
    hot.step = step;
    float lp = -1;
    ASSERT_EQ(SampleRowCpu(x.data(), 4, hot, force.data(), 1, -1, &lp), 3);
    EXPECT_NEAR(lp, 0.0f, 1e-6f);
  }
}

}  // namespace
}  // namespace lazyattn
