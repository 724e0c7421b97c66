// The engine core on a ScriptedCpuRunner (steps that fail on demand), with requests of long
// documents whose encodings span several steps, and a drain that checks every request ended
// exactly once and the KV pool is whole (engine_core_safety_test.cc,
// engine_core_isolation_test.cc).
#ifndef LAZYATTN_SERVICES_WORKER_ENGINE_ENGINE_CORE_SAFETY_TEST_FIXTURE_H_
#define LAZYATTN_SERVICES_WORKER_ENGINE_ENGINE_CORE_SAFETY_TEST_FIXTURE_H_

#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/monotonic_time.h"
#include "gtest/gtest.h"
#include "services/worker/engine/engine_core.h"
#include "services/worker/engine/request_prep.h"
#include "services/worker/engine/scripted_cpu_runner_for_test.h"
#include "services/worker/model/model_fingerprint.h"
#include "services/worker/model/random_weights.h"
#include "services/worker/model/tokenizer/byte_tokenizer.h"

namespace lazyattn::engine_core_safety_testing {

using ::lazyattn::testing::ScriptedCpuRunner;

struct Outcome {
  int calls = 0;
  absl::Status status;
  RequestResult result;
};

class EngineCoreSafetyTest : public ::testing::Test {
 protected:
  void Init(int64_t blocks = 256, int max_batch_tokens = 64, EngineOptions extra = {}) {
    if (!weights_) {
      weights_ = MakeRandomWeights(TinyTestConfig(), 3);
      tokenizer_ = MakeByteTokenizer();
      identity_ = {ModelFingerprint(*weights_), TokenizerFingerprint(*tokenizer_)};
    }
    auto runner = std::make_unique<ScriptedCpuRunner>(weights_.get(), blocks);
    runner_ = runner.get();
    extra.max_batch_tokens = max_batch_tokens;
    extra.check_pool_every_step = true;
    extra.keep_first_logits = true;
    core_ = std::make_unique<EngineCore>(std::move(runner), tokenizer_.get(), extra);
    outcomes_.clear();
    keys_.clear();
  }
  void SetUp() override { Init(); }

  static std::vector<int32_t> Tokens(int n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<int32_t> t(n);
    for (int32_t& x : t) x = static_cast<int32_t>(rng() % 256);
    return t;
  }
  // Document d: 150 + 40 d tokens, so its encoding spans several 64-token steps.
  static EngineDocument Doc(int d) {
    return {.id = "doc" + std::to_string(d), .token_ids = Tokens(150 + 40 * d, 100 + d)};
  }
  EngineRequest Request(const std::vector<int>& docs, CacheMode mode, int max_tokens = 6) {
    EngineRequest r;
    r.system_prefix = "Answer from the documents.\n";
    for (int d : docs) r.documents.push_back(Doc(d));
    r.question = "Which one?";
    r.mode = mode;
    r.sampling = {.max_tokens = max_tokens, .ignore_eos = true};
    return r;
  }
  PreparedRequest Prepare(const EngineRequest& r) {
    auto p = PrepareRequest(r, *tokenizer_, weights_->config, identity_, {});
    EXPECT_TRUE(p.ok()) << p.status();
    return *std::move(p);
  }
  uint64_t Add(PreparedRequest p) {
    const uint64_t key = next_key_++;
    p.callbacks.on_done = [this, key](const absl::Status& s, const RequestResult& r) {
      Outcome& o = outcomes_[key];
      ++o.calls;
      o.status = s;
      o.result = r;
    };
    keys_.push_back(key);
    return core_->Add(std::move(p));
  }
  uint64_t Add(const EngineRequest& r) { return Add(Prepare(r)); }
  const Outcome& Last() { return outcomes_[keys_.back()]; }

  // Steps until nothing is left; checks that each request ended exactly once and that no block
  // stays referenced.
  void Drain(absl::Time now = MonotonicNow()) {
    for (int guard = 0; core_->HasWork() && guard < 100000; ++guard) core_->Step(now);
    ASSERT_FALSE(core_->HasWork()) << "the engine did not drain";
    for (uint64_t key : keys_) EXPECT_EQ(outcomes_[key].calls, 1) << "request " << key;
    EXPECT_EQ(core_->cache().pool().num_referenced(), 0);
    EXPECT_TRUE(core_->cache().CheckInvariant().ok()) << core_->cache().CheckInvariant();
  }
  Outcome RunOne(const EngineRequest& r) {
    Add(r);
    Drain();
    return Last();
  }

  std::unique_ptr<ModelWeights> weights_;
  std::unique_ptr<Tokenizer> tokenizer_;
  ModelIdentity identity_;
  ScriptedCpuRunner* runner_ = nullptr;
  std::unique_ptr<EngineCore> core_;
  std::map<uint64_t, Outcome> outcomes_;
  std::vector<uint64_t> keys_;
  uint64_t next_key_ = 1;
};

}  // namespace lazyattn::engine_core_safety_testing

#endif  // LAZYATTN_SERVICES_WORKER_ENGINE_ENGINE_CORE_SAFETY_TEST_FIXTURE_H_
