#include "services/worker/engine/top_logprobs.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "services/worker/engine/sampler.h"

namespace lazyattn {
namespace {

// log_softmax in double, the independent reference.
std::vector<double> LogSoftmax(const std::vector<float>& x) {
  const double mx = *std::max_element(x.begin(), x.end());
  double z = 0;
  for (float v : x) z += std::exp(double(v) - mx);
  std::vector<double> out;
  for (float v : x) out.push_back(double(v) - mx - std::log(z));
  return out;
}

// Ids by value descending, then id ascending: the order the list must have.
std::vector<int32_t> Order(const std::vector<float>& x) {
  std::vector<int32_t> ids(x.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return x[a] > x[b]; });
  return ids;
}

std::vector<float> RandomRow(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 3.0f);
  std::vector<float> x(n);
  for (float& v : x) v = d(rng);
  return x;
}

void ExpectMatchesReference(const std::vector<TopLogprob>& top, const std::vector<float>& x,
                            size_t k) {
  const std::vector<double> want = LogSoftmax(x);
  const std::vector<int32_t> order = Order(x);
  ASSERT_EQ(top.size(), std::min(k, x.size()));
  for (size_t i = 0; i < top.size(); ++i) {
    EXPECT_EQ(top[i].token_id, order[i]) << "entry " << i;
    EXPECT_NEAR(top[i].logprob, want[order[i]], 2e-5) << "entry " << i;
  }
}

TEST(TopLogprobsTest, GreedyRowMatchesLogSoftmaxAndTheChosenEntryIsExact) {
  const std::vector<float> x = RandomRow(1000, 1);
  SamplingRowParams row{.flags = kSampleLogprob};
  float lp = 0;
  const int32_t chosen = SampleRowCpu(x.data(), 1000, row, nullptr, 0, -1, &lp);
  const std::vector<TopLogprob> top = TopLogprobs(x, row, {}, chosen, lp, 20);
  ExpectMatchesReference(top, x, 20);
  ASSERT_FALSE(top.empty());
  EXPECT_EQ(top[0].token_id, chosen);
  EXPECT_EQ(top[0].logprob, lp);  // bit for bit: the same number the chunk reports
}

TEST(TopLogprobsTest, ASampledTokenAnchorsTheListAndKeepsItsOwnValue) {
  const std::vector<float> x = RandomRow(512, 2);
  const std::vector<int32_t> order = Order(x);
  int checked = 0;
  for (uint64_t seed = 0; seed < 200 && checked < 3; ++seed) {
    SamplingRowParams row{.temperature = 2.0f, .flags = kSampleLogprob, .seed = seed};
    float lp = 0;
    const int32_t chosen = SampleRowCpu(x.data(), 512, row, nullptr, 0, -1, &lp);
    const size_t rank = std::find(order.begin(), order.end(), chosen) - order.begin();
    if (rank == 0 || rank >= 8) continue;  // a draw inside the list, not at its top
    const std::vector<TopLogprob> top = TopLogprobs(x, row, {}, chosen, lp, 8);
    ExpectMatchesReference(top, x, 8);
    EXPECT_EQ(top[rank].token_id, chosen);
    EXPECT_EQ(top[rank].logprob, lp);
    ++checked;
  }
  EXPECT_EQ(checked, 3) << "no seed drew inside the top 8 but below the first";
}

TEST(TopLogprobsTest, PenaltiesRankAsTheDrawSawThem) {
  std::vector<float> x = RandomRow(300, 3);
  const int32_t top_id = Order(x)[0];
  // The best id was generated twice and the second best is in the prompt: both penalized.
  const int32_t second = Order(x)[1];
  const std::vector<int32_t> history = {second, 5, top_id, top_id};
  const std::vector<PenaltyEntry> penalties = PenaltyEntries(history, /*prompt_tokens=*/2);
  SamplingRowParams row{.repetition_penalty = 1.5f, .frequency_penalty = 1.0f,
                        .flags = kSampleLogprob};
  float lp = 0;
  const int32_t chosen = SampleRowCpu(x.data(), 300, row, penalties.data(),
                                      static_cast<int32_t>(penalties.size()), -1, &lp);
  std::vector<float> penalized = x;
  for (const PenaltyEntry& e : penalties) {
    penalized[e.id] = PenalizedLogit(x[e.id], row, e);
  }
  ASSERT_NE(Order(penalized)[0], top_id) << "the penalties should move the best id down";
  const std::vector<TopLogprob> top = TopLogprobs(x, row, penalties, chosen, lp, 10);
  ExpectMatchesReference(top, penalized, 10);
  EXPECT_EQ(top[0].token_id, chosen);
  EXPECT_EQ(top[0].logprob, lp);
}

TEST(TopLogprobsTest, TiesTakeTheLowestIdFirstAndNanComesLast) {
  const std::vector<float> x = {1.0f, NAN, 2.0f, 2.0f, -INFINITY, 1.0f};
  SamplingRowParams row{.flags = kSampleLogprob};
  float lp = 0;
  const int32_t chosen = SampleRowCpu(x.data(), 6, row, nullptr, 0, -1, &lp);
  EXPECT_EQ(chosen, 2);
  const std::vector<TopLogprob> top = TopLogprobs(x, row, {}, chosen, lp, 20);  // k > vocab
  ASSERT_EQ(top.size(), 6u);
  const std::vector<int32_t> ids = {2, 3, 0, 5, 4, 1};
  for (size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(top[i].token_id, ids[i]) << "entry " << i;
  EXPECT_EQ(top[0].logprob, top[1].logprob);
  const double two = std::log(2 * std::exp(1.0) + 2);  // log(sum exp) over the finite values
  EXPECT_NEAR(top[2].logprob, 1.0 - (1.0 + two), 1e-5);
  EXPECT_EQ(top[4].logprob, -INFINITY);  // probability 0; the worker reports -9999
  EXPECT_EQ(top[5].logprob, -INFINITY);
  EXPECT_TRUE(TopLogprobs(x, row, {}, chosen, lp, 0).empty());
}

// The skip-below-the-last scan against a full sort, on rows of few distinct values (ties at the
// list's edge everywhere), NaN and -inf scattered, and NaN at the start, before the list fills.
TEST(TopLogprobsTest, MatchesAFullSortOnRowsOfTiesAndNans) {
  std::mt19937 rng(5);
  const float kinds[] = {NAN, -INFINITY, -1.0f, 0.0f, -0.0f, 0.5f, 2.0f, 2.0f, 3.0f};
  for (int trial = 0; trial < 40; ++trial) {
    std::vector<float> x(2000 + trial);
    for (float& v : x) v = kinds[rng() % 9];
    for (int i = 0; i < 4; ++i) x[i] = NAN;
    if (trial % 4 == 0) std::fill(x.begin() + 4, x.end(), -INFINITY);  // a list of -inf and NaN
    // The full order: value descending (NaN last, -0 == 0), then id ascending.
    std::vector<int32_t> ids(x.size());
    std::iota(ids.begin(), ids.end(), 0);
    auto key = [&](int32_t i) { return x[i] != x[i] ? -2.0 * HUGE_VAL : double(x[i]); };
    std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) {
      return key(a) > key(b) || (key(a) == key(b) && x[a] == x[a] && x[b] != x[b]);
    });
    SamplingRowParams row{.flags = kSampleLogprob};
    for (int k : {1, 5, 20}) {
      const std::vector<TopLogprob> top = TopLogprobs(x, row, {}, ids[0], NAN, k);
      ASSERT_EQ(top.size(), size_t(k));
      for (int i = 0; i < k; ++i) {
        EXPECT_EQ(top[i].token_id, ids[i]) << "trial " << trial << " k " << k << " entry " << i;
      }
    }
  }
}

// Logits at the float limit (+inf scales to FLT_MAX, as the draw takes it): the ids tied with
// the chosen one get exactly its logprob, log(1/2) here, and the list stays most likely first.
// Anchoring on x_chosen - chosen_logprob rounded that normalizer to FLT_MAX and put id 2 at 0.
TEST(TopLogprobsTest, TiesAtTheFloatLimitKeepTheOrder) {
  const std::vector<float> x = {INFINITY, 1.0f, INFINITY, 0.0f};
  SamplingRowParams row{.flags = kSampleLogprob};
  float lp = 0;
  const int32_t chosen = SampleRowCpu(x.data(), 4, row, nullptr, 0, -1, &lp);
  ASSERT_EQ(chosen, 0);
  EXPECT_NEAR(lp, std::log(0.5), 1e-6);
  const std::vector<TopLogprob> top = TopLogprobs(x, row, {}, chosen, lp, 4);
  ASSERT_EQ(top.size(), 4u);
  EXPECT_EQ(top[0].token_id, 0);
  EXPECT_EQ(top[1].token_id, 2);
  EXPECT_EQ(top[0].logprob, lp);
  EXPECT_EQ(top[1].logprob, lp);
  EXPECT_LT(top[2].logprob, -1e30f);  // finite next to FLT_MAX: probability 0 in float terms
  for (size_t i = 1; i < top.size(); ++i) EXPECT_LE(top[i].logprob, top[i - 1].logprob);
  // No finite logit at all: no distribution, every entry -inf (reported as -9999).
  const std::vector<float> none = {-INFINITY, NAN, -INFINITY};
  for (const TopLogprob& t : TopLogprobs(none, row, {}, 0, NAN, 3)) {
    EXPECT_EQ(t.logprob, -INFINITY) << "id " << t.token_id;
  }
}

TEST(TopLogprobsTest, AnAnchorThatIsNotFiniteFallsBackToTheRowsOwnNormalizer) {
  const std::vector<float> x = RandomRow(200, 4);
  SamplingRowParams row{.flags = kSampleLogprob};
  const int32_t chosen = Order(x)[0];
  ExpectMatchesReference(TopLogprobs(x, row, {}, chosen, NAN, 5), x, 5);
  ExpectMatchesReference(TopLogprobs(x, row, {}, chosen, -INFINITY, 5), x, 5);
}

TEST(TopLogprobsTest, ValidationBoundsTheCountAndNeedsLogprobs) {
  SamplingParams p{.logprobs = true, .top_logprobs = kMaxTopLogprobs};
  EXPECT_TRUE(ValidateSamplingParams(p, 100).ok());
  p.top_logprobs = kMaxTopLogprobs + 1;
  EXPECT_NE(ValidateSamplingParams(p, 100).message().find("top_logprobs = 21: must be in [0, 20]"),
            std::string::npos)
      << ValidateSamplingParams(p, 100);
  p.top_logprobs = -1;
  EXPECT_NE(ValidateSamplingParams(p, 100).message().find("top_logprobs = -1"), std::string::npos);
  p.top_logprobs = 3;
  p.logprobs = false;
  EXPECT_NE(ValidateSamplingParams(p, 100).message().find("top_logprobs = 3: needs logprobs"),
            std::string::npos)
      << ValidateSamplingParams(p, 100);
}

}  // namespace
}  // namespace lazyattn
