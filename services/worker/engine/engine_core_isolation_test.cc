// A failed step of several requests or encodings (EngineCore's "A failed step"): its items run
// one per step, so only what the runner cannot run fails, and everything else generates what it
// would have without the fault.
#include <algorithm>
#include <array>
#include <span>
#include <vector>

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
      std::function<bool(std::span<const ForwardChunk>)> fail_if = nullptr) {
    Init(/*blocks=*/256, /*max_batch_tokens=*/512);
    runner_->fail_if = std::move(fail_if);
    for (const EngineRequest& r : requests) Add(r);
    Drain();
    std::vector<Outcome> out;
    for (uint64_t key : keys_) out.push_back(outcomes_[key]);
    return out;
  }
  // What each request generates alone on a runner without faults.
  std::vector<std::vector<int32_t>> Alone(const std::vector<EngineRequest>& requests) {
    std::vector<std::vector<int32_t>> out;
    for (const EngineRequest& r : requests) {
      Init(/*blocks=*/256, /*max_batch_tokens=*/512);
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
    // The step after the poisoned request ran alone held the healthy ones again, together.
    const std::vector<size_t>& steps = runner_->step_chunks;
    EXPECT_TRUE(std::any_of(steps.begin(), steps.end(), [](size_t n) { return n >= 2; }));
  }
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

// A step the runner cannot run for its size (every step of two chunks or more fails, as when a
// batch's workspace does not fit) costs its requests time, not their answers: every step is
// tried, its items run alone, the next step batches them again. Nothing fails, nothing differs.
TEST_F(EngineCoreIsolationTest, AStepTooLargeForTheRunnerEndsEveryRequestAsAlone) {
  const std::vector<EngineRequest> requests = {Request({1, 2}, CacheMode::kLazy),
                                               Request({2, 3}, CacheMode::kBlock, 9),
                                               Request({}, CacheMode::kLazy, 4)};
  const std::vector<std::vector<int32_t>> alone = Alone(requests);
  const std::vector<Outcome> out = RunTogether(
      requests, [](std::span<const ForwardChunk> chunks) { return chunks.size() >= 2; });
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_TRUE(out[i].status.ok()) << "request " << i << ": " << out[i].status;
    EXPECT_EQ(out[i].result.token_ids, alone[i]) << "request " << i;
  }
  EXPECT_GT(core_->stats().steps_isolated, 0);
  EXPECT_EQ(core_->stats().steps_isolated, core_->stats().step_failures);
  EXPECT_TRUE(core_->health().ok()) << core_->health();
}

// Isolated steps that fail count toward max_consecutive_step_failures like any: a runner that
// fails everything stops the core serving at the third. The batch of three encodings fails
// (1), the first alone (2: its request ends Internal), the second alone (3: the core stops, and
// what it holds ends Unavailable).
TEST_F(EngineCoreIsolationTest, IsolatedFailuresStillStopABrokenRunner) {
  const std::vector<Outcome> out =
      RunTogether({Request({1}, CacheMode::kLazy), Request({2}, CacheMode::kLazy),
                   Request({3}, CacheMode::kLazy)},
                  [](std::span<const ForwardChunk>) { return true; });
  EXPECT_EQ(out[0].status.code(), absl::StatusCode::kInternal) << out[0].status;
  EXPECT_EQ(out[1].status.code(), absl::StatusCode::kUnavailable) << out[1].status;
  EXPECT_EQ(out[2].status.code(), absl::StatusCode::kUnavailable) << out[2].status;
  EXPECT_EQ(core_->stats().step_failures, 3);
  EXPECT_EQ(core_->health().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace lazyattn
