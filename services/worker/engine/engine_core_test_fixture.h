// The engine core's test fixture: a tiny random model, a byte tokenizer and an EngineCore with
// f32 KV pools, requests of random documents, and a loop that steps the core until they end
// (engine_core_test.cc, engine_core_output_test.cc, engine_core_pipelining_test.cc).
#ifndef LAZYATTN_SERVICES_WORKER_ENGINE_ENGINE_CORE_TEST_FIXTURE_H_
#define LAZYATTN_SERVICES_WORKER_ENGINE_ENGINE_CORE_TEST_FIXTURE_H_

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/monotonic_time.h"
#include "gtest/gtest.h"
#include "services/worker/engine/engine_core.h"
#include "services/worker/engine/kv_cache_cpu.h"
#include "services/worker/engine/request_prep.h"
#include "services/worker/model/model_fingerprint.h"
#include "services/worker/model/random_weights.h"
#include "services/worker/model/tokenizer/byte_tokenizer.h"

namespace lazyattn::engine_core_testing {

struct Outcome {
  absl::Status status;
  RequestResult result;
};

class EngineCoreTest : public ::testing::Test {
 protected:
  void Init(int64_t max_positions = 4096, int64_t blocks = 256, int max_batch_tokens = 64) {
    ModelConfig c = TinyTestConfig();
    c.max_positions = max_positions;
    weights_ = MakeRandomWeights(c, 3);
    tokenizer_ = MakeByteTokenizer();
    identity_ = {ModelFingerprint(*weights_), TokenizerFingerprint(*tokenizer_)};
    // f32 KV pools: the mode equalities below are fp32 ones (block mode's re-rotated keys would
    // take one more half rounding than lazy mode's in an F16 pool; that case has its own test).
    SetCpuKvCacheDtype(kv_dtype_);
    core_ = std::make_unique<EngineCore>(weights_.get(), tokenizer_.get(),
                                         EngineOptions{.num_kv_blocks = blocks,
                                                       .max_batch_tokens = max_batch_tokens,
                                                       .keep_first_logits = true});
  }
  void SetUp() override { Init(); }
  void TearDown() override { SetCpuKvCacheDtype(KvCacheDtype::kF16); }
  KvCacheDtype kv_dtype_ = KvCacheDtype::kF32;

  static std::vector<int32_t> RandomTokens(int n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<int32_t> t(n);
    for (int32_t& x : t) x = static_cast<int32_t>(rng() % 256);
    return t;
  }

  EngineRequest Request(const std::vector<int>& doc_ids, CacheMode mode, int max_tokens = 8) {
    EngineRequest r;
    r.system_prefix = "You answer from the documents.\n";
    for (int d : doc_ids) {
      r.documents.push_back(
          {.id = "doc" + std::to_string(d), .token_ids = RandomTokens(17 + 13 * d, 100 + d)});
    }
    r.question = "Which document mentions it?";
    r.mode = mode;
    r.sampling = {.max_tokens = max_tokens, .ignore_eos = true};
    return r;
  }

  // Queues requests and steps the core until all are done.
  std::vector<Outcome> Run(const std::vector<EngineRequest>& requests) {
    std::vector<Outcome> out(requests.size());
    for (size_t i = 0; i < requests.size(); ++i) {
      auto p = PrepareRequest(requests[i], *tokenizer_, weights_->config, identity_, {});
      EXPECT_TRUE(p.ok()) << p.status();
      p->callbacks.on_done = [&out, i](const absl::Status& s, const RequestResult& r) {
        out[i] = {s, r};
      };
      core_->Add(std::move(*p));
    }
    int guard = 0;
    while (core_->HasWork() && ++guard < 100000) core_->Step(MonotonicNow());
    EXPECT_FALSE(core_->HasWork()) << "engine did not drain";
    EXPECT_TRUE(core_->cache().CheckInvariant().ok()) << core_->cache().CheckInvariant();
    return out;
  }
  Outcome RunOne(const EngineRequest& r) { return Run({r})[0]; }

  static float MaxDiff(const std::vector<float>& a, const std::vector<float>& b) {
    EXPECT_EQ(a.size(), b.size());
    float m = 0;
    for (size_t i = 0; i < a.size() && i < b.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
    return m;
  }

  std::unique_ptr<ModelWeights> weights_;
  std::unique_ptr<Tokenizer> tokenizer_;
  ModelIdentity identity_;
  std::unique_ptr<EngineCore> core_;
};

// Tolerance for two fp32 computations of the same function whose rotations differ in order
// (rotate-once-at-write vs rotate-at-attention) on a random 2-layer model with logits ~O(1).
constexpr float kModeTolerance = 1e-4f;

}  // namespace lazyattn::engine_core_testing

#endif  // LAZYATTN_SERVICES_WORKER_ENGINE_ENGINE_CORE_TEST_FIXTURE_H_
