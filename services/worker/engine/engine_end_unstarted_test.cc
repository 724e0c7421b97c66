// Requests that wait for admission. EngineCore::EndUnstarted and Engine::EndUnstarted, what a
// worker's drain uses: those that have sent nothing end with the given status at the next step,
// later ones too, while the running request finishes as usual. And RequestCallbacks::on_queued,
// the waiting request's sign of life.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/monotonic_time.h"
#include "gtest/gtest.h"
#include "services/worker/engine/engine.h"
#include "services/worker/engine/engine_core.h"
#include "services/worker/engine/request_prep.h"
#include "services/worker/model/model_fingerprint.h"
#include "services/worker/model/random_weights.h"
#include "services/worker/model/tokenizer/byte_tokenizer.h"

namespace lazyattn {
namespace {

struct Outcome {
  bool done = false;
  absl::Status status;
  int tokens = 0;
  int queued_reports = 0;              // on_queued calls
  int queued_reports_after_start = 0;  // ... after its first token (there must be none)
};

class EndUnstartedTest : public ::testing::Test {
 protected:
  void SetUp() override {
    weights_ = MakeRandomWeights(TinyTestConfig(), 3);
    tokenizer_ = MakeByteTokenizer();
    identity_ = {ModelFingerprint(*weights_), TokenizerFingerprint(*tokenizer_)};
  }
  EngineRequest Request(int max_tokens) const {
    EngineRequest r;
    r.system_prefix = "You answer from the documents.\n";
    r.documents.push_back({.text = "The warehouse in Lyon ships orders within two days."});
    r.question = "When do orders ship?";
    r.sampling = {.max_tokens = max_tokens, .ignore_eos = true};
    return r;
  }
  PreparedRequest Prepare(int max_tokens, Outcome* outcome) {
    auto p = PrepareRequest(Request(max_tokens), *tokenizer_, weights_->config, identity_, {});
    EXPECT_TRUE(p.ok()) << p.status();
    p->callbacks.on_token = [outcome](int32_t id, std::string_view) {
      outcome->tokens += id >= 0 ? 1 : 0;
    };
    p->callbacks.on_queued = [outcome] {
      ++outcome->queued_reports;
      if (outcome->tokens > 0) ++outcome->queued_reports_after_start;
    };
    p->callbacks.on_done = [outcome](const absl::Status& s, const RequestResult&) {
      outcome->done = true;
      outcome->status = s;
    };
    return std::move(*p);
  }

  // Steps `core` until `done()` (at most `limit` steps), the clock `step` further each time from
  // *now, which it leaves after the last step. Returns the steps taken.
  static int StepUntil(EngineCore& core, absl::Time* now, absl::Duration step,
                       const std::function<bool()>& done, int limit = 10000) {
    int steps = 0;
    for (; !done() && steps < limit; ++steps, *now += step) core.Step(*now);
    return steps;
  }

  std::unique_ptr<ModelWeights> weights_;
  std::unique_ptr<Tokenizer> tokenizer_;
  ModelIdentity identity_;
};

TEST_F(EndUnstartedTest, WaitingRequestsEndAtTheNextStepAndTheRunningOneFinishes) {
  EngineCore core(weights_.get(), tokenizer_.get(),
                  {.num_kv_blocks = 256, .max_batch_tokens = 64, .max_running = 1});
  Outcome running, queued[2], later;
  core.Add(Prepare(40, &running));
  for (int guard = 0; running.tokens == 0 && guard < 1000; ++guard) core.Step(MonotonicNow());
  ASSERT_GT(running.tokens, 0);
  for (Outcome& q : queued) core.Add(Prepare(2, &q));
  core.Step(MonotonicNow());  // max_running 1: they wait
  for (const Outcome& q : queued) ASSERT_FALSE(q.done);
  ASSERT_EQ(core.Load().waiting, 2);

  const absl::Status drain = absl::UnavailableError("draining; not started");
  core.EndUnstarted(drain);
  core.Step(MonotonicNow());
  for (const Outcome& q : queued) {
    EXPECT_TRUE(q.done);
    EXPECT_EQ(q.status, drain);
    EXPECT_EQ(q.tokens, 0);
  }
  EXPECT_FALSE(running.done);
  EXPECT_EQ(core.Load().waiting, 0);
  // One added afterwards ends at its first step too, never admitted.
  core.Add(Prepare(2, &later));
  core.Step(MonotonicNow());
  EXPECT_TRUE(later.done);
  EXPECT_EQ(later.status, drain);
  EXPECT_EQ(later.tokens, 0);

  for (int guard = 0; core.HasWork() && guard < 10000; ++guard) core.Step(MonotonicNow());
  EXPECT_TRUE(running.done);
  EXPECT_TRUE(running.status.ok()) << running.status;
  EXPECT_EQ(running.tokens, 40);
  EXPECT_TRUE(core.cache().CheckInvariant().ok());
  EXPECT_EQ(core.cache().pool().num_referenced(), 0);
}

// A request waiting for admission hears, at most once per kQueuedReportInterval, that the engine
// works through the request ahead of it (on_queued: what keeps a router's first-token timeout
// from moving it to start over in another queue); never once it runs.
TEST_F(EndUnstartedTest, AWaitingRequestHearsThatTheQueueMoves) {
  EngineCore core(weights_.get(), tokenizer_.get(),
                  {.num_kv_blocks = 256, .max_batch_tokens = 64, .max_running = 1});
  Outcome running, waiting;
  core.Add(Prepare(40, &running));
  PreparedRequest p = Prepare(2, &waiting);
  core.Add(std::move(p));
  const absl::Duration step = EngineCore::kQueuedReportInterval / 5;
  absl::Time now = MonotonicNow();
  const int steps = StepUntil(core, &now, step, [&] { return running.done; });
  ASSERT_TRUE(running.done);
  ASSERT_GE(steps, 40);
  EXPECT_FALSE(waiting.done);
  EXPECT_GE(waiting.queued_reports, steps / 5 - 1);
  EXPECT_LE(waiting.queued_reports, steps / 5 + 1);
  StepUntil(core, &now, step, [&] { return !core.HasWork(); });
  EXPECT_TRUE(waiting.done);
  EXPECT_TRUE(waiting.status.ok()) << waiting.status;
  EXPECT_EQ(waiting.tokens, 2);
  EXPECT_EQ(waiting.queued_reports_after_start, 0);
}

// Admitted but starved: a prompt waiting for the step's token budget behind an older one (a
// CPU worker's usual queue, with engine.max_running above the requests it holds) hears the same
// until its first token.
TEST_F(EndUnstartedTest, AnAdmittedPromptBehindAnotherHearsThatTheQueueMoves) {
  EngineCore core(weights_.get(), tokenizer_.get(),
                  {.num_kv_blocks = 256, .max_batch_tokens = 16, .max_running = 4});
  Outcome first, second;
  core.Add(Prepare(2, &first));
  PreparedRequest p = Prepare(2, &second);
  p.question = std::vector<int32_t>(40, 'q');  // its own prompt tail: behind the first's
  core.Add(std::move(p));
  absl::Time now = MonotonicNow();
  const absl::Duration step = EngineCore::kQueuedReportInterval;
  StepUntil(core, &now, step, [&] { return first.tokens > 0; });
  ASSERT_GT(first.tokens, 0);
  EXPECT_GE(second.queued_reports, 3);  // 16 tokens a step over a prompt of ~100: several steps
  StepUntil(core, &now, step, [&] { return !core.HasWork(); });
  EXPECT_TRUE(first.status.ok()) << first.status;
  EXPECT_TRUE(second.status.ok()) << second.status;
  EXPECT_EQ(second.tokens, 2);
  EXPECT_EQ(second.queued_reports_after_start, 0);
}

TEST_F(EndUnstartedTest, TheEngineRefusesNewRequestsWithTheStatus) {
  Engine engine(weights_.get(), tokenizer_.get(), {.num_kv_blocks = 256});
  Outcome before;
  ASSERT_TRUE(engine.SubmitPrepared(Prepare(2, &before)).ok());
  ASSERT_TRUE(engine.WaitIdleAndCheck().ok());
  EXPECT_TRUE(before.status.ok()) << before.status;
  const absl::Status drain = absl::UnavailableError("draining; not started");
  engine.EndUnstarted(drain);
  Outcome after;
  const absl::StatusOr<uint64_t> id = engine.SubmitPrepared(Prepare(2, &after));
  EXPECT_EQ(id.status(), drain);
  EXPECT_FALSE(after.done);  // refused at once: the callbacks are not called
}

}  // namespace
}  // namespace lazyattn
