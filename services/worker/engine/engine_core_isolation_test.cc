// A failed step of several requests or encodings (EngineCore's "A failed step"): its items run
// one per step, so only what the runner cannot run fails, and everything else generates what it
// would have without the fault.
#include <algorithm>
#include <array>
#include <span>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/worker/engine/engine_core_safety_test_fixture.h"

namespace lazyattn {
namespace {

using engine_core_safety_testing::EngineCoreSafetyTest;
using engine_core_safety_testing::Outcome;

// Token ids no random document of the fixture holds in a row (one chance in 256^6 per place).
constexpr std::array<int32_t, 6> kPoison = {11, 22, 33, 44, 55, 66};

bool HoldsPoison(std::span<const ForwardChunk> chunks) {
  return std::any_of(chunks.begin(), chunks.end(), [](const ForwardChunk& c) {
    return std::search(c.tokens.begin(), c.tokens.end(), kPoison.begin(), kPoison.end()) !=
           c.tokens.end();
  });
}

class EngineCoreIsolationTest : public EngineCoreSafetyTest {
 protected:
  // Runs `requests` together on a fresh core, the runner failing the steps `fail_if` names.
  std::vector<Outcome> RunTogether(
      const std::vector<EngineRequest>& requests,
      std::function<bool(std::span<const ForwardChunk>)> fail_if = nullptr,
      int max_batch_tokens = 512) {
    Init(/*blocks=*/256, max_batch_tokens);
    runner_->fail_if = std::move(fail_if);
    for (const EngineRequest& r : requests) Add(r);
    Drain();
    std::vector<Outcome> out;
    for (uint64_t key : keys_) out.push_back(outcomes_[key]);
    return out;
  }
  // What each request generates alone on a runner without faults.
  std::vector<std::vector<int32_t>> Alone(const std::vector<EngineRequest>& requests,
                                          int max_batch_tokens = 512) {
    std::vector<std::vector<int32_t>> out;
    for (const EngineRequest& r : requests) {
      Init(/*blocks=*/256, max_batch_tokens);
      out.push_back(RunOne(r).result.token_ids);
    }
    return out;
  }
  EngineRequest Poisoned(EngineRequest r) {
    r.question_token_ids = std::vector<int32_t>(kPoison.begin(), kPoison.end());
    return r;
  }
};

// A question the runner cannot run fails alone: the two other requests of its steps (the same
// documents, so their questions are prefilled in the same step as the poisoned one) end OK with
// the tokens they generate alone. Two failed steps: the batch, then the poisoned request alone.
TEST_F(EngineCoreIsolationTest, AChunkTheRunnerCannotRunFailsOnlyItsRequest) {
  for (CacheMode mode :
       {CacheMode::kLazy, CacheMode::kBlock, CacheMode::kPrefix, CacheMode::kFull}) {
    SCOPED_TRACE(CacheModeName(mode));
    const std::vector<EngineRequest> healthy = {Request({1, 2}, mode), Request({1, 2}, mode, 9)};
    const std::vector<std::vector<int32_t>> alone = Alone(healthy);
    const std::vector<Outcome> out =
        RunTogether({healthy[0], Poisoned(Request({1, 2}, mode)), healthy[1]}, HoldsPoison);
    EXPECT_TRUE(out[0].status.ok()) << out[0].status;
    EXPECT_TRUE(out[2].status.ok()) << out[2].status;
    EXPECT_EQ(out[0].result.token_ids, alone[0]);
    EXPECT_EQ(out[2].result.token_ids, alone[1]);
    EXPECT_EQ(out[1].status.code(), absl::StatusCode::kInternal) << out[1].status;
    EXPECT_NE(out[1].status.message().find("injected device failure"), std::string::npos);
    EXPECT_EQ(core_->stats().step_failures, 2);
    EXPECT_EQ(core_->stats().steps_isolated, 1);
    EXPECT_TRUE(core_->health().ok()) << core_->health();
    const auto& steps = runner_->steps;
    const auto batch =
        std::find_if(steps.begin(), steps.end(), [](const auto& s) { return s.failed; });
    ASSERT_NE(batch, steps.end());
    ASSERT_GE(batch->chunk_tokens.size(), 3u);
    ASSERT_GE(steps.end() - batch, 5);
    // Its requests then ran one per step, each under a fresh block table (the runner may hold a
    // version of the old one that the failed step never used): a sequence no step used before.
    for (auto solo = batch + 1; solo != batch + 4; ++solo) {
      ASSERT_EQ(solo->chunk_tokens.size(), 1u);
      for (auto before = steps.begin(); before != solo; ++before) {
        EXPECT_THAT(before->table_sequences,
                    ::testing::Not(::testing::Contains(solo->table_sequences[0])));
      }
    }
    // Once the poisoned one failed alone, the healthy ones ran together again.
    EXPECT_TRUE(std::any_of(batch + 4, steps.end(),
                            [](const auto& s) { return !s.failed && s.chunk_tokens.size() >= 2; }));
  }
}

// Two requests the runner cannot run in one batch fail alone, and do not stop the worker: a
// suspect failing alone is its own fault, not the device's (max_consecutive_step_failures 3
// would otherwise count the batch and both).
TEST_F(EngineCoreIsolationTest, TwoBadRequestsInOneBatchDoNotStopTheWorker) {
  const EngineRequest healthy = Request({1, 2}, CacheMode::kLazy);
  const std::vector<std::vector<int32_t>> alone = Alone({healthy});
  const std::vector<Outcome> out =
      RunTogether({Poisoned(healthy), healthy, Poisoned(healthy)}, HoldsPoison);
  EXPECT_EQ(out[0].status.code(), absl::StatusCode::kInternal) << out[0].status;
  EXPECT_EQ(out[2].status.code(), absl::StatusCode::kInternal) << out[2].status;
  EXPECT_TRUE(out[1].status.ok()) << out[1].status;
  EXPECT_EQ(out[1].result.token_ids, alone[0]);
  EXPECT_EQ(core_->stats().step_failures, 3);
  EXPECT_TRUE(core_->health().ok()) << core_->health();
}

// A suspect cancelled before its turn ends Cancelled; the others go on.
TEST_F(EngineCoreIsolationTest, ACancelledSuspectEndsCancelled) {
  const EngineRequest healthy = Request({1, 2}, CacheMode::kLazy);
  const std::vector<std::vector<int32_t>> alone = Alone({healthy});
  Init(/*blocks=*/256, /*max_batch_tokens=*/512);
  runner_->fail_if = HoldsPoison;
  const uint64_t cancelled = Add(healthy);
  Add(Poisoned(healthy));
  Add(healthy);
  for (int guard = 0; core_->stats().step_failures == 0 && guard < 100; ++guard) {
    core_->Step(MonotonicNow());
  }
  ASSERT_EQ(core_->stats().steps_isolated, 1);
  core_->Cancel(cancelled);
  Drain();
  EXPECT_EQ(outcomes_[keys_[0]].status.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(outcomes_[keys_[1]].status.code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(outcomes_[keys_[2]].status.ok()) << outcomes_[keys_[2]].status;
  EXPECT_EQ(outcomes_[keys_[2]].result.token_ids, alone[0]);
}

// A document the runner cannot encode fails the requests that wait for it, and only them.
TEST_F(EngineCoreIsolationTest, AnEncodingTheRunnerCannotRunFailsOnlyItsWaiters) {
  for (CacheMode mode : {CacheMode::kLazy, CacheMode::kBlock}) {
    SCOPED_TRACE(CacheModeName(mode));
    EngineRequest poisoned = Request({3}, mode);
    std::vector<int32_t>& doc = *poisoned.documents[0].token_ids;
    std::copy(kPoison.begin(), kPoison.end(), doc.begin() + 40);
    poisoned.documents[0].id = "poisoned";
    const EngineRequest healthy = Request({1, 2}, mode);
    const std::vector<std::vector<int32_t>> alone = Alone({healthy});
    const std::vector<Outcome> out = RunTogether({poisoned, healthy, poisoned}, HoldsPoison);
    EXPECT_EQ(out[0].status.code(), absl::StatusCode::kInternal) << out[0].status;
    EXPECT_EQ(out[2].status.code(), absl::StatusCode::kInternal) << out[2].status;
    EXPECT_TRUE(out[1].status.ok()) << out[1].status;
    EXPECT_EQ(out[1].result.token_ids, alone[0]);
    EXPECT_EQ(core_->stats().steps_isolated, 1);
    EXPECT_TRUE(core_->health().ok()) << core_->health();
  }
}

// A step the runner cannot run for its size (the first two steps of two chunks or more fail, as
// when a batch's workspace does not fit for a moment) costs its requests time, not their
// answers: its items run alone, the next step batches them again. Nothing fails, nothing
// differs. Each item runs alone with no more tokens than its chunk had in the failed step (a
// 64-token budget splits the encodings), so a step alone is never larger than the one that
// failed. (Batches that keep failing stop the worker: ABrokenRunnerStillStopsTheWorker.)
TEST_F(EngineCoreIsolationTest, AStepTooLargeForTheRunnerEndsEveryRequestAsAlone) {
  const std::vector<EngineRequest> requests = {Request({1, 2}, CacheMode::kLazy),
                                               Request({2, 3}, CacheMode::kBlock, 9),
                                               Request({}, CacheMode::kLazy, 4)};
  const std::vector<std::vector<int32_t>> alone = Alone(requests, /*max_batch_tokens=*/64);
  int too_large = 0;
  const std::vector<Outcome> out = RunTogether(
      requests,
      [&too_large](std::span<const ForwardChunk> chunks) {
        return chunks.size() >= 2 && ++too_large <= 2;
      },
      /*max_batch_tokens=*/64);
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_TRUE(out[i].status.ok()) << "request " << i << ": " << out[i].status;
    EXPECT_EQ(out[i].result.token_ids, alone[i]) << "request " << i;
  }
  EXPECT_EQ(core_->stats().steps_isolated, 2);
  EXPECT_EQ(core_->stats().step_failures, 2);
  EXPECT_TRUE(core_->health().ok()) << core_->health();
  const auto& steps = runner_->steps;
  for (size_t f = 0; f < steps.size(); ++f) {
    if (!steps[f].failed) continue;
    std::vector<int64_t> failed = steps[f].chunk_tokens, solos;
    ASSERT_LT(f + failed.size(), steps.size());
    for (size_t k = 1; k <= failed.size(); ++k) {
      ASSERT_EQ(steps[f + k].chunk_tokens.size(), 1u) << "step " << f + k;
      solos.push_back(steps[f + k].chunk_tokens[0]);
    }
    std::sort(failed.begin(), failed.end());
    std::sort(solos.begin(), solos.end());
    EXPECT_EQ(solos, failed) << "the items of failed step " << f << " alone";
  }
}

// A runner that fails everything still stops the core serving: each round, the batch fails
// (counted), then its items alone (each ends Internal, not counted); the third round's batch is
// the third ordinary failure in a row, and its requests end Unavailable for a router to retry.
TEST_F(EngineCoreIsolationTest, ABrokenRunnerStillStopsTheWorker) {
  Init(/*blocks=*/256, /*max_batch_tokens=*/512);
  runner_->fail_if = [](std::span<const ForwardChunk>) { return true; };
  for (int round = 1; round <= 3; ++round) {
    SCOPED_TRACE(::testing::Message() << "round " << round);
    const size_t first = keys_.size();
    for (int d = 1; d <= 3; ++d) Add(Request({d}, CacheMode::kLazy));
    for (int guard = 0; core_->HasWork() && guard < 1000; ++guard) core_->Step(MonotonicNow());
    ASSERT_FALSE(core_->HasWork());
    const absl::StatusCode want =
        round < 3 ? absl::StatusCode::kInternal : absl::StatusCode::kUnavailable;
    for (size_t i = first; i < keys_.size(); ++i) {
      EXPECT_EQ(outcomes_[keys_[i]].status.code(), want) << outcomes_[keys_[i]].status;
    }
    EXPECT_EQ(core_->health().ok(), round < 3) << core_->health();
  }
  EXPECT_EQ(core_->stats().step_failures, (1 + 3) + (1 + 3) + 1);
}

}  // namespace
}  // namespace lazyattn
