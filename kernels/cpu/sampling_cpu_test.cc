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

}  // namespace
}  // namespace lazyattn
