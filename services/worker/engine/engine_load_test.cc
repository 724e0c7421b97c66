// What a worker reports as its queued prefill load (EngineCore::Load) and as the documents a
// request reused (RequestUsage::document_hit_tokens, prefix_tokens): the router routes and
// predicts by these (docs/router.md, "Predictions").
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/monotonic_time.h"
#include "gtest/gtest.h"
#include "services/worker/engine/engine_core.h"
#include "services/worker/engine/request_prep.h"
#include "services/worker/model/model_fingerprint.h"
#include "services/worker/model/random_weights.h"
#include "services/worker/model/tokenizer/byte_tokenizer.h"

namespace lazyattn {
namespace {

class EngineLoadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    weights_ = MakeRandomWeights(TinyTestConfig(), 3);
    tokenizer_ = MakeByteTokenizer();
    identity_ = {ModelFingerprint(*weights_), TokenizerFingerprint(*tokenizer_)};
    core_ =
        std::make_unique<EngineCore>(weights_.get(), tokenizer_.get(),
                                     EngineOptions{.num_kv_blocks = 256, .max_batch_tokens = 64});
  }

  static int DocTokens(int d) { return 17 + 13 * d; }
  EngineRequest Request(const std::vector<int>& doc_ids, CacheMode mode) {
    EngineRequest r;
    r.system_prefix = "You answer from the documents.\n";
    for (int d : doc_ids) {
      std::mt19937 rng(100 + d);
      std::vector<int32_t> ids(DocTokens(d));
      for (int32_t& x : ids) x = static_cast<int32_t>(rng() % 256);
      r.documents.push_back({.id = "doc" + std::to_string(d), .token_ids = std::move(ids)});
    }
    r.question = "Which document mentions it?";
    r.mode = mode;
    r.sampling = {.max_tokens = 2, .ignore_eos = true};
    return r;
  }
  PreparedRequest Prepare(const EngineRequest& r) {
    auto p = PrepareRequest(r, *tokenizer_, weights_->config, identity_, {});
    EXPECT_TRUE(p.ok()) << p.status();
    return std::move(*p);
  }
  // Queues without stepping: the requests wait, and Load() reports them.
  void Queue(const EngineRequest& r, RequestResult* result = nullptr) {
    PreparedRequest p = Prepare(r);
    p.callbacks.on_done = [result](const absl::Status& s, const RequestResult& out) {
      EXPECT_TRUE(s.ok()) << s;
      if (result != nullptr) *result = out;
    };
    core_->Add(std::move(p));
  }
  void Drain() {
    int guard = 0;
    while (core_->HasWork() && ++guard < 100000) core_->Step(MonotonicNow());
    ASSERT_FALSE(core_->HasWork());
  }
  RequestResult RunOne(const EngineRequest& r) {
    RequestResult result;
    Queue(r, &result);
    Drain();
    return result;
  }

  std::unique_ptr<ModelWeights> weights_;
  std::unique_ptr<Tokenizer> tokenizer_;
  ModelIdentity identity_;
  std::unique_ptr<EngineCore> core_;
};

TEST_F(EngineLoadTest, QueuedLoadLeavesOutDocumentsTheCacheHolds) {
  RunOne(Request({0, 1}, CacheMode::kLazy));
  ASSERT_EQ(core_->Load().queued_prefill_tokens, 0);
  const int64_t prompt = Prepare(Request({0, 1, 2}, CacheMode::kLazy)).prompt_tokens();
  Queue(Request({0, 1, 2}, CacheMode::kLazy));
  // Documents 0 and 1 are held: only the prefix, document 2 and the question are work.
  EXPECT_EQ(core_->Load().queued_prefill_tokens, prompt - DocTokens(0) - DocTokens(1));
  EXPECT_EQ(core_->Load().waiting_tokens, prompt);  // the admission bound still sees it all
  // A second waiting request with document 2: encoded once, so it adds only its own tokens.
  const int64_t second = Prepare(Request({2}, CacheMode::kLazy)).prompt_tokens();
  Queue(Request({2}, CacheMode::kLazy));
  EXPECT_EQ(core_->Load().queued_prefill_tokens,
            prompt - DocTokens(0) - DocTokens(1) + second - DocTokens(2));
  Drain();
  EXPECT_EQ(core_->Load().queued_prefill_tokens, 0);
}

TEST_F(EngineLoadTest, BlockModeLoadLeavesOutDocumentsItHoldsOrCanCopy) {
  RunOne(Request({0}, CacheMode::kBlock));  // document 0 right after the prefix
  const int64_t same = Prepare(Request({0}, CacheMode::kBlock)).prompt_tokens();
  Queue(Request({0}, CacheMode::kBlock));
  EXPECT_EQ(core_->Load().queued_prefill_tokens, same - DocTokens(0));
  Drain();
  // Document 0 after document 1: another offset, where it is copied from the entry computed
  // first (a block copy, not prefill work); document 1 is new, so it is work.
  const int64_t moved = Prepare(Request({1, 0}, CacheMode::kBlock)).prompt_tokens();
  Queue(Request({1, 0}, CacheMode::kBlock));
  EXPECT_EQ(core_->Load().queued_prefill_tokens, moved - DocTokens(0));
  Drain();
  // A position-free entry is copied, never encoded, by a block request at any offset.
  RunOne(Request({3}, CacheMode::kLazy));
  const int64_t after_lazy = Prepare(Request({1, 3}, CacheMode::kBlock)).prompt_tokens();
  Queue(Request({1, 3}, CacheMode::kBlock));
  // Document 1 sits first, where the previous request stored it; document 3 is copied.
  EXPECT_EQ(core_->Load().queued_prefill_tokens, after_lazy - DocTokens(3) - DocTokens(1));
  Drain();
}

TEST_F(EngineLoadTest, UsageReportsHitTokensUnderTheRequestsOwnKeyAndThePrefixLength) {
  const PreparedRequest p = Prepare(Request({0, 1}, CacheMode::kLazy));
  const RequestResult cold = RunOne(Request({0, 1}, CacheMode::kLazy));
  EXPECT_EQ(cold.usage.document_hit_tokens, 0);
  EXPECT_EQ(cold.usage.prefix_tokens, static_cast<int64_t>(p.system_prefix.size()));
  const RequestResult warm = RunOne(Request({1, 0}, CacheMode::kLazy));
  EXPECT_EQ(warm.usage.document_hit_tokens, DocTokens(0) + DocTokens(1));

  // Block mode: the same offset is a hit; another offset is a copy, cached but no hit.
  RunOne(Request({0, 1}, CacheMode::kBlock));  // lazy entries are copied in: no hit
  const RequestResult same = RunOne(Request({0, 1}, CacheMode::kBlock));
  EXPECT_EQ(same.usage.document_hit_tokens, DocTokens(0) + DocTokens(1));
  const RequestResult moved = RunOne(Request({1, 0}, CacheMode::kBlock));
  EXPECT_EQ(moved.usage.document_hit_tokens, 0);
  EXPECT_EQ(moved.usage.document_cached_tokens, DocTokens(0) + DocTokens(1));
  EXPECT_EQ(moved.usage.prefix_tokens, static_cast<int64_t>(p.system_prefix.size()));
}

TEST_F(EngineLoadTest, JoiningAnotherRequestsEncodingCountsAsReuse) {
  RequestResult first, second;
  Queue(Request({4, 5}, CacheMode::kLazy), &first);
  Queue(Request({5, 4}, CacheMode::kLazy), &second);
  Drain();
  EXPECT_EQ(first.usage.document_hit_tokens, 0);
  EXPECT_EQ(second.usage.document_hit_tokens, DocTokens(4) + DocTokens(5));
}

// What the engine publishes every step: exact with few waiting requests; with many, the queued
// prefill estimate (a cache lookup per waiting document) is carried over between recomputations
// kLoadEstimateInterval apart, while the counts stay current.
TEST_F(EngineLoadTest, PublishedLoadRecomputesTheEstimateOnlyEveryIntervalWhenManyWait) {
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  // Left waiting: the core fails them as it goes away, which is no part of this test.
  for (int i = 0; i < EngineCore::kExactLoadWaiting; ++i) {
    core_->Add(Prepare(Request({i % 7}, CacheMode::kLazy)));
  }
  EngineLoad exact = core_->Load();
  EngineLoad published = core_->PublishedLoad(t0);
  EXPECT_EQ(published.queued_prefill_tokens, exact.queued_prefill_tokens);
  EXPECT_EQ(published.waiting_tokens, exact.waiting_tokens);

  core_->Add(Prepare(Request({20}, CacheMode::kLazy)));  // a document nobody queued: more prefill
  exact = core_->Load();
  ASSERT_GT(exact.queued_prefill_tokens, published.queued_prefill_tokens);
  const EngineLoad carried = core_->PublishedLoad(t0 + absl::Milliseconds(1));
  EXPECT_EQ(carried.queued_prefill_tokens, published.queued_prefill_tokens) << "carried over";
  EXPECT_EQ(carried.waiting, exact.waiting);
  EXPECT_EQ(carried.waiting_tokens, exact.waiting_tokens);
  EXPECT_EQ(carried.running, exact.running);

  const EngineLoad due = core_->PublishedLoad(t0 + EngineCore::kLoadEstimateInterval);
  EXPECT_EQ(due.queued_prefill_tokens, exact.queued_prefill_tokens);
}

}  // namespace
}  // namespace lazyattn
