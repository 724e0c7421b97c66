#include "services/worker/engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace lazyattn {
namespace {

TEST(SamplerTest, GreedyTakesArgmaxLowestIdOnTies) {
  Sampler s(SamplingParams{});
  EXPECT_EQ(s.Sample(std::vector<float>{0.1f, 3.0f, -2.0f, 3.0f}), 1);
}

TEST(SamplerTest, TopKOneIsGreedyAtAnyTemperature) {
  Sampler s(SamplingParams{.temperature = 5.0f, .top_k = 1, .seed = 7});
  for (int i = 0; i < 50; ++i) EXPECT_EQ(s.Sample(std::vector<float>{0.0f, 0.5f, 0.4f}), 1);
}

// A temperature under kMinSamplingTemperature (here a denormal, whose 1/T is inf) passes
// validation and samples the greedy token, not one of the logits it would have blown up.
TEST(SamplerTest, TinyTemperatureIsValidAndGreedy) {
  const SamplingParams p{.temperature = 1e-40f, .seed = 11};
  EXPECT_TRUE(ValidateSamplingParams(p, 8).ok());
  Sampler s(p);
  for (int i = 0; i < 100; ++i) {
    EXPECT_EQ(s.Sample(std::vector<float>{0.0f, 3.0f, 2.9999f, -1.0f, 0.0f}), 1);
  }
}

TEST(SamplerTest, TopPKeepsSmallestSetReachingP) {
  // probs ~ {0.64, 0.24, 0.09, 0.03}; top_p 0.8 keeps ids 0 and 1 only.
  const std::vector<float> logits = {std::log(0.64f), std::log(0.24f), std::log(0.09f),
                                     std::log(0.03f)};
  Sampler s(SamplingParams{.temperature = 1.0f, .top_p = 0.8f, .seed = 1});
  std::map<int, int> counts;
  for (int i = 0; i < 4000; ++i) ++counts[s.Sample(logits)];
  EXPECT_EQ(counts.count(2), 0u);
  EXPECT_EQ(counts.count(3), 0u);
  // Renormalised: 0.64 / 0.88 = 0.727.
  EXPECT_NEAR(counts[0] / 4000.0, 0.727, 0.03);
}

TEST(SamplerTest, TemperatureOneMatchesSoftmax) {
  const std::vector<float> logits = {0.0f, 1.0f, 2.0f};
  Sampler s(SamplingParams{.temperature = 1.0f, .seed = 3});
  std::vector<int> counts(3);
  const int n = 20000;
  for (int i = 0; i < n; ++i) ++counts[s.Sample(logits)];
  const double z = 1 + std::exp(1.0) + std::exp(2.0);
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(counts[i] / double(n), std::exp(double(i)) / z, 0.015);
}

TEST(SamplerTest, SameSeedSameSequence) {
  std::vector<float> logits(100);
  for (int i = 0; i < 100; ++i) logits[i] = std::sin(i * 0.7f);
  Sampler a(SamplingParams{.temperature = 1.0f, .seed = 42}),
      b(SamplingParams{.temperature = 1.0f, .seed = 42}),
      c(SamplingParams{.temperature = 1.0f, .seed = 43});
  std::vector<int> sa, sb, sc;
  for (int i = 0; i < 32; ++i) {
    sa.push_back(a.Sample(logits));
    sb.push_back(b.Sample(logits));
    sc.push_back(c.Sample(logits));
  }
  EXPECT_EQ(sa, sb);
  EXPECT_NE(sa, sc);
}

TEST(SamplerTest, ValidationNamesTheField) {
  EXPECT_TRUE(ValidateSamplingParams(SamplingParams{}, 10).ok());
  auto msg = [](SamplingParams p) { return std::string(ValidateSamplingParams(p, 10).message()); };
  EXPECT_NE(msg({.temperature = -1}).find("temperature"), std::string::npos);
  EXPECT_NE(msg({.top_k = -3}).find("top_k"), std::string::npos);
  EXPECT_NE(msg({.top_p = 0}).find("top_p"), std::string::npos);
  EXPECT_NE(msg({.top_p = 1.5f}).find("top_p"), std::string::npos);
  EXPECT_NE(msg({.max_tokens = 0}).find("max_tokens"), std::string::npos);
  EXPECT_NE(msg({.stop = {""}}).find("stop"), std::string::npos);
  EXPECT_NE(msg({.stop_token_ids = {10}}).find("stop_token_ids"), std::string::npos);
  EXPECT_EQ(ValidateSamplingParams({.temperature = NAN}, 10).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(SamplerTest, ValidationNamesThePenaltyAndMinPFields) {
  auto msg = [](SamplingParams p) { return std::string(ValidateSamplingParams(p, 10).message()); };
  SamplingParams p;
  p.min_p = 1.5f;
  EXPECT_NE(msg(p).find("min_p"), std::string::npos);
  p = {};
  p.repetition_penalty = 0;
  EXPECT_NE(msg(p).find("repetition_penalty"), std::string::npos);
  p = {};
  p.presence_penalty = 3;
  EXPECT_NE(msg(p).find("presence_penalty"), std::string::npos);
  p = {};
  p.frequency_penalty = NAN;
  EXPECT_NE(msg(p).find("frequency_penalty"), std::string::npos);
}

// Counts kept a token at a time equal PenaltyEntries of the whole history at every length, in
// the same order, and a step counts only its new tokens; a history that is not an extension of
// the last (shorter, or another question length) is counted afresh.
TEST(SamplerTest, PenaltyCountsFollowAGrowingHistoryCountingOnlyNewTokens) {
  std::mt19937 rng(7);
  std::vector<int32_t> history;
  for (int i = 0; i < 40; ++i) history.push_back(static_cast<int32_t>(rng() % 12));
  PenaltyCounts counts;
  constexpr int64_t kQuestion = 25;
  for (size_t n = 0; n <= history.size(); ++n) {
    const int64_t before = counts.tokens_counted();
    const auto prefix = std::span(history).first(n);
    const int64_t question = std::min<int64_t>(kQuestion, static_cast<int64_t>(n));
    const std::span<const PenaltyEntry> got = counts.Sync(prefix, question);
    const std::vector<PenaltyEntry> want = PenaltyEntries(prefix, question);
    ASSERT_EQ(got.size(), want.size()) << n;
    for (size_t k = 0; k < want.size(); ++k) {
      EXPECT_EQ(got[k].id, want[k].id) << n << " " << k;
      EXPECT_EQ(got[k].output_count, want[k].output_count) << n << " " << k;
      EXPECT_EQ(got[k].in_prompt, want[k].in_prompt) << n << " " << k;
    }
    // Past the question each step adds one token; while the question grows it is recounted.
    if (n > static_cast<size_t>(kQuestion)) EXPECT_EQ(counts.tokens_counted() - before, 1) << n;
  }
  const int64_t before = counts.tokens_counted();
  const auto shorter = std::span(history).first(30);
  const std::span<const PenaltyEntry> again = counts.Sync(shorter, kQuestion);
  EXPECT_EQ(counts.tokens_counted() - before, 30);  // counted afresh
  EXPECT_EQ(again.size(), PenaltyEntries(shorter, kQuestion).size());
  const int64_t before_other_question = counts.tokens_counted();
  counts.Sync(shorter, 10);
  EXPECT_EQ(counts.tokens_counted() - before_other_question, 30);
}

TEST(SamplerTest, PenaltyEntriesCountOutputAndMarkPrompt) {
  const std::vector<int32_t> tokens = {5, 7, 5, 9, 7, 7};  // prompt: 5 7 5; output: 9 7 7
  const auto e = PenaltyEntries(tokens, 3);
  ASSERT_EQ(e.size(), 3u);
  EXPECT_EQ(e[0].id, 5);
  EXPECT_EQ(e[0].in_prompt, 1);
  EXPECT_EQ(e[0].output_count, 0);
  EXPECT_EQ(e[1].id, 7);
  EXPECT_EQ(e[1].in_prompt, 1);
  EXPECT_EQ(e[1].output_count, 2);
  EXPECT_EQ(e[2].id, 9);
  EXPECT_EQ(e[2].in_prompt, 0);
  EXPECT_EQ(e[2].output_count, 1);
}

TEST(SamplerTest, RowAdjustmentsMergeTheBiasIntoTheHistory) {
  const std::vector<int32_t> tokens = {5, 7, 5, 9, 7, 7};  // prompt: 5 7 5; output: 9 7 7
  const std::vector<LogitBias> bias = {{2, -100.0f}, {7, 1.5f}, {12, 3.0f}};
  SamplingRowParams row{.presence_penalty = 0.5f, .flags = kLogitBias};
  auto by_id = [](std::vector<PenaltyEntry> e) {
    std::sort(e.begin(), e.end(), [](auto& a, auto& b) { return a.id < b.id; });
    return e;
  };
  const auto e = by_id(RowAdjustments(row, PenaltyEntries(tokens, 3), bias));
  ASSERT_EQ(e.size(), 5u);
  const int32_t ids[] = {2, 5, 7, 9, 12};
  const int32_t counts[] = {0, 0, 2, 1, 0};
  const int32_t prompt[] = {0, 1, 1, 0, 0};
  const float biases[] = {-100.0f, 0.0f, 1.5f, 0.0f, 3.0f};
  for (int i = 0; i < 5; ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(e[i].id, ids[i]);
    EXPECT_EQ(e[i].output_count, counts[i]);
    EXPECT_EQ(e[i].in_prompt, prompt[i]);
    EXPECT_EQ(e[i].bias, biases[i]);
  }
  // Bias alone: the history is not listed (no penalty would read it).
  row.presence_penalty = 0.0f;
  const auto only = by_id(RowAdjustments(row, PenaltyEntries(tokens, 3), bias));
  ASSERT_EQ(only.size(), 3u);
  EXPECT_EQ(only[1].id, 7);
  EXPECT_EQ(only[1].output_count, 0);
  // Penalties alone: the bias is not read without the flag.
  row = {.presence_penalty = 0.5f};
  EXPECT_EQ(RowAdjustments(row, PenaltyEntries(tokens, 3), bias).size(), 3u);
  EXPECT_TRUE(RowAdjustments(SamplingRowParams{}, PenaltyEntries(tokens, 3), bias).empty());
}

TEST(SamplerTest, LogitBiasIsValidatedAndFlagged) {
  SamplingParams p;
  p.logit_bias = {{1, 2.0f}, {4, -100.0f}};
  EXPECT_TRUE(ValidateSamplingParams(p, 10).ok());
  EXPECT_EQ(RowSamplingParams(p, 0).flags & kLogitBias, kLogitBias);
  EXPECT_EQ(RowSamplingParams(SamplingParams{}, 0).flags & kLogitBias, 0u);
  auto msg = [](const SamplingParams& q) {
    return std::string(ValidateSamplingParams(q, 10).message());
  };
  p.logit_bias = {{10, 1.0f}};
  EXPECT_NE(msg(p).find("logit_bias = 10: outside the vocabulary"), std::string::npos) << msg(p);
  p.logit_bias = {{3, 1.0f}, {3, 2.0f}};
  EXPECT_NE(msg(p).find("distinct"), std::string::npos) << msg(p);
  p.logit_bias = {{4, 1.0f}, {3, 2.0f}};
  EXPECT_NE(msg(p).find("increasing"), std::string::npos) << msg(p);
  p.logit_bias = {{3, 100.5f}};
  EXPECT_NE(msg(p).find("logit_bias[3]"), std::string::npos) << msg(p);
  p.logit_bias = {{3, NAN}};
  EXPECT_NE(msg(p).find("logit_bias[3]"), std::string::npos) << msg(p);
  // The host sampler applies it: a ban moves greedy off the maximum.
  std::vector<float> logits = {0.0f, 3.0f, 2.0f};
  SamplingParams greedy;
  greedy.logit_bias = {{1, -100.0f}};
  Sampler s(greedy);
  EXPECT_EQ(s.Sample(logits), 2);
}

// The draw is a function of (seed, step, logits): a sampler's n-th draw equals the twin's draw
// at step n, whatever came before.
TEST(SamplerTest, DrawNumberIsTheStep) {
  std::vector<float> logits(50);
  for (int i = 0; i < 50; ++i) logits[i] = std::cos(i * 1.3f);
  const SamplingParams p{.temperature = 1.0f, .top_p = 0.9f, .seed = 5};
  Sampler s(p);
  for (uint64_t step = 0; step < 20; ++step) {
    const int32_t got = s.Sample(logits);
    EXPECT_EQ(got, SampleRowCpu(logits.data(), 50, RowSamplingParams(p, step), nullptr, 0, -1));
  }
}

}  // namespace
}  // namespace lazyattn
