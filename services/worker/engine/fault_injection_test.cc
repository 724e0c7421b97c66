// The engine core under injected step faults (fault_injection.h): failed steps are counted, a
// run of engine.max_consecutive_step_failures of them or one sticky device error stops it
// serving, and then every request it held ends Unavailable (a router fails over those that sent
// nothing to their client), new ones too.
#include "services/worker/engine/fault_injection.h"

#include <algorithm>
#include <map>
#include <vector>

#include "common/device_error.h"
#include "common/monotonic_time.h"
#include "gtest/gtest.h"
#include "services/worker/engine/cpu_runner.h"
#include "services/worker/engine/engine_core.h"
#include "services/worker/engine/request_prep.h"
#include "services/worker/model/model_fingerprint.h"
#include "services/worker/model/random_weights.h"
#include "services/worker/model/tokenizer/byte_tokenizer.h"

namespace lazyattn {
namespace {

struct Outcome {
  int calls = 0;
  absl::Status status;
  int64_t tokens = 0;
};

class FaultInjectionTest : public ::testing::Test {
 protected:
  void Init(const FaultInjectionOptions& faults, int max_consecutive = 3) {
    weights_ = MakeRandomWeights(TinyTestConfig(), 3);
    tokenizer_ = MakeByteTokenizer();
    identity_ = {ModelFingerprint(*weights_), TokenizerFingerprint(*tokenizer_)};
    EngineOptions options;
    options.max_batch_tokens = 64;
    options.max_running = 1;  // one running request, the next ones queued
    options.max_consecutive_step_failures = max_consecutive;
    core_ = std::make_unique<EngineCore>(
        WithFaultInjection(std::make_unique<CpuModelRunner>(weights_.get(), 256), faults),
        tokenizer_.get(), options);
  }
  int Add(const std::string& question, int max_tokens = 8) {
    EngineRequest r;
    r.question = question;
    r.sampling = {.max_tokens = max_tokens, .ignore_eos = true};
    auto p = PrepareRequest(r, *tokenizer_, weights_->config, identity_, {});
    EXPECT_TRUE(p.ok()) << p.status();
    const int key = next_key_++;
    p->callbacks.on_token = [this, key](int32_t id, std::string_view) {
      if (id >= 0) ++outcomes_[key].tokens;
    };
    p->callbacks.on_done = [this, key](const absl::Status& s, const RequestResult&) {
      ++outcomes_[key].calls;
      outcomes_[key].status = s;
    };
    core_->Add(*std::move(p));
    return key;
  }
  void Drain() {
    for (int guard = 0; core_->HasWork() && guard < 10000; ++guard) core_->Step(MonotonicNow());
    ASSERT_FALSE(core_->HasWork());
    for (const auto& [key, o] : outcomes_) EXPECT_EQ(o.calls, 1) << "request " << key;
    EXPECT_EQ(core_->cache().pool().num_referenced(), 0);
  }

  std::unique_ptr<ModelWeights> weights_;
  std::unique_ptr<Tokenizer> tokenizer_;
  ModelIdentity identity_;
  std::unique_ptr<EngineCore> core_;
  std::map<int, Outcome> outcomes_;
  int next_key_ = 0;
};

TEST_F(FaultInjectionTest, OffByDefaultAndWithoutStepFaultsTheRunnerIsUnwrapped) {
  EXPECT_FALSE(FaultInjectionOptions{}.any());
  EXPECT_TRUE(FaultInjectionOptions{.abort_on_prompt_marker = "x"}.any());
  auto weights = MakeRandomWeights(TinyTestConfig(), 3);
  auto cpu = std::make_unique<CpuModelRunner>(weights.get(), 16);
  ModelRunner* raw = cpu.get();
  EXPECT_EQ(WithFaultInjection(std::move(cpu), {.abort_on_prompt_marker = "x"}).get(), raw);
  EXPECT_EQ((FaultInjectionOptions{.fail_steps_after = 2, .abort_on_prompt_marker = "P"}
                 .Describe()),
            "fail_steps_after=2, abort_on_prompt_marker=\"P\"");
}

TEST_F(FaultInjectionTest, StickyErrorStopsServingAtOnceAndEveryRequestIsUnavailable) {
  // Step 0 prefills the first request (its first token), steps 1.. decode: step 2 fails sticky.
  Init({.sticky_error_after = 2});
  const int running = Add("first question");
  const int queued = Add("second question");
  Drain();
  EXPECT_EQ(core_->stats().step_failures, 1);
  EXPECT_EQ(core_->health().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(core_->health().message().find("sticky device error"), std::string::npos)
      << core_->health();
  // It had streamed tokens (a router cannot retry it then, but says the worker failed)...
  EXPECT_EQ(outcomes_[running].tokens, 2);
  EXPECT_EQ(outcomes_[running].status.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(outcomes_[running].status.message().find("injected sticky"), std::string::npos)
      << outcomes_[running].status;
  // ... this one never started: a router fails it over.
  EXPECT_EQ(outcomes_[queued].tokens, 0);
  EXPECT_EQ(outcomes_[queued].status.code(), absl::StatusCode::kUnavailable);
  // New requests are refused at once.
  const int late = Add("third question");
  EXPECT_EQ(outcomes_[late].status.code(), absl::StatusCode::kUnavailable);
}

TEST_F(FaultInjectionTest, ConsecutiveFailuresStopServingOnlyAtTheThreshold) {
  Init({.fail_steps_after = 0}, /*max_consecutive=*/3);
  const int a = Add("a");
  Drain();
  // Below the threshold a failed step is the request's failure, with the runner's error.
  EXPECT_EQ(outcomes_[a].status.code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(core_->health().ok());
  const int b = Add("b");
  Drain();
  EXPECT_EQ(outcomes_[b].status.code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(core_->health().ok());
  const int c = Add("c");
  const int d = Add("d");
  Drain();
  // The third failure in a row: c (in the step) and d (queued) may go elsewhere.
  EXPECT_EQ(core_->stats().step_failures, 3);
  EXPECT_EQ(core_->health().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(core_->health().message().find("3 failed steps in a row"), std::string::npos)
      << core_->health();
  EXPECT_EQ(outcomes_[c].status.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(outcomes_[d].status.code(), absl::StatusCode::kUnavailable);
}

// Fails the steps whose index is in `failing` (0-based), runs the others on the CPU backend.
class FlakyRunner final : public ModelRunner {
 public:
  FlakyRunner(const ModelWeights* weights, std::vector<int> failing)
      : inner_(weights, 256), failing_(std::move(failing)) {}
  const ModelConfig& config() const override { return inner_.config(); }
  std::string backend_name() const override { return "cpu-flaky"; }
  int64_t num_kv_blocks() const override { return inner_.num_kv_blocks(); }
  absl::StatusOr<ForwardOutput> Forward(std::span<const ForwardChunk> chunks) override {
    const int step = steps_++;
    if (std::find(failing_.begin(), failing_.end(), step) != failing_.end()) {
      return absl::InternalError("flaky step");
    }
    return inner_.Forward(chunks);
  }
  absl::Status CopyBlocks(std::span<const BlockCopy> copies) override {
    return inner_.CopyBlocks(copies);
  }

 private:
  CpuModelRunner inner_;
  const std::vector<int> failing_;
  int steps_ = 0;
};

TEST_F(FaultInjectionTest, ASuccessfulStepResetsTheCount) {
  Init({});
  EngineOptions options;
  options.max_running = 1;
  options.max_consecutive_step_failures = 3;
  // Two failures, a success, two failures: never three in a row.
  core_ = std::make_unique<EngineCore>(
      std::make_unique<FlakyRunner>(weights_.get(), std::vector<int>{0, 1, 3, 4}),
      tokenizer_.get(), options);
  for (const char* q : {"a", "b", "c", "d", "e"}) Add(q, 1);
  Drain();
  EXPECT_EQ(core_->stats().step_failures, 4);
  EXPECT_TRUE(core_->health().ok()) << core_->health();
  const int after = Add("f", 1);
  Drain();
  EXPECT_TRUE(outcomes_[after].status.ok()) << outcomes_[after].status;
}

TEST(FaultInjectionMarkerTest, FindsTheMarkerInAnyTextField) {
  EngineRequest r;
  r.question = "plain";
  EXPECT_FALSE(RequestContainsMarker(r, "POISON"));
  EXPECT_FALSE(RequestContainsMarker(r, ""));
  r.documents.push_back({.id = "d", .text = "a POISON pill"});
  EXPECT_TRUE(RequestContainsMarker(r, "POISON"));
  r.documents.clear();
  r.system_prefix = "xPOISONx";
  EXPECT_TRUE(RequestContainsMarker(r, "POISON"));
}

TEST(DeviceErrorTest, StickyMarkKeepsCodeAndMessage) {
  const absl::Status plain = absl::InternalError("illegal address");
  EXPECT_FALSE(IsStickyDeviceError(plain));
  const absl::Status sticky = MarkStickyDeviceError(plain);
  EXPECT_TRUE(IsStickyDeviceError(sticky));
  EXPECT_EQ(sticky.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(sticky.message(), "illegal address");
  EXPECT_FALSE(IsStickyDeviceError(MarkStickyDeviceError(absl::OkStatus())));
}

}  // namespace
}  // namespace lazyattn
