// The cache modes computed by the engine core on a tiny random model: equalities between modes,
// reuse, and what happens to blocks.
#include "services/worker/engine/engine_core.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <numeric>
#include <random>
#include <set>

#include "common/monotonic_time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/worker/engine/cpu_runner.h"
#include "services/worker/engine/engine_core_test_fixture.h"
#include "services/worker/engine/kv_cache_cpu.h"
#include "services/worker/engine/request_prep.h"
#include "services/worker/model/model_fingerprint.h"
#include "services/worker/model/random_weights.h"
#include "services/worker/model/tokenizer/byte_tokenizer.h"

namespace lazyattn {
namespace {

using engine_core_testing::EngineCoreTest;
using engine_core_testing::Outcome;

// Tolerance for two fp32 computations of the same function whose rotations differ in order
// (rotate-once-at-write vs rotate-at-attention) on a random 2-layer model with logits ~O(1).
constexpr float kModeTolerance = 1e-4f;

// A max_tokens past the model's context reserves only what the context leaves: generation ends
// there ("length") anyway. Counting all of it refused requests a pool could hold.
TEST_F(EngineCoreTest, MaxTokensPastTheContextIsBoundedByIt) {
  Init(/*max_positions=*/256, /*blocks=*/24);
  for (CacheMode mode : {CacheMode::kFull, CacheMode::kBlock, CacheMode::kLazy}) {
    const Outcome o = RunOne(Request({0, 1}, mode, /*max_tokens=*/4000));
    ASSERT_TRUE(o.status.ok()) << o.status;
    EXPECT_EQ(o.result.finish_reason, "length");
    EXPECT_EQ(o.result.usage.prompt_tokens + static_cast<int64_t>(o.result.token_ids.size()), 256);
  }
}

TEST_F(EngineCoreTest, LazyAndBlockAgreeColdAndWarmInRandomOrders) {
  std::mt19937 rng(7);
  std::vector<int> docs = {0, 1, 2, 3, 4};
  for (int round = 0; round < 4; ++round) {  // round 0 is cold; later rounds hit the caches
    std::shuffle(docs.begin(), docs.end(), rng);
    const Outcome lazy = RunOne(Request(docs, CacheMode::kLazy));
    const Outcome block = RunOne(Request(docs, CacheMode::kBlock));
    ASSERT_TRUE(lazy.status.ok() && block.status.ok()) << lazy.status << block.status;
    EXPECT_LT(MaxDiff(lazy.result.first_logits, block.result.first_logits), kModeTolerance)
        << "round " << round;
    EXPECT_EQ(lazy.result.token_ids, block.result.token_ids) << "round " << round;
    if (round > 0) {
      EXPECT_EQ(lazy.result.usage.documents_hit, 5) << "lazy reuses any order";
    }
  }
  const auto& lazy = core_->stats().mode(CacheMode::kLazy);
  EXPECT_EQ(lazy.doc_lookups, 20);
  EXPECT_EQ(lazy.doc_hits, 15);
}

// On F16 pools (the serving default) block mode's copies round re-rotated keys to half once
// more (2^-11 relative, block_copy.h); on this model that moves logits by ~4e-4 (measured).
TEST_F(EngineCoreTest, LazyAndBlockAgreeOnF16PoolsWithinAHalfRounding) {
  kv_dtype_ = KvCacheDtype::kF16;
  Init();
  std::vector<int> docs = {3, 1, 4, 0};
  for (int round = 0; round < 2; ++round) {  // cold, then block mode copies cached documents
    std::reverse(docs.begin(), docs.end());
    const Outcome lazy = RunOne(Request(docs, CacheMode::kLazy));
    const Outcome block = RunOne(Request(docs, CacheMode::kBlock));
    ASSERT_TRUE(lazy.status.ok() && block.status.ok()) << lazy.status << block.status;
    EXPECT_LT(MaxDiff(lazy.result.first_logits, block.result.first_logits), 20 * kModeTolerance)
        << "round " << round;
  }
}

TEST_F(EngineCoreTest, LazyWarmEqualsLazyCold) {
  const Outcome cold = RunOne(Request({0, 1, 2}, CacheMode::kLazy));
  const Outcome warm = RunOne(Request({0, 1, 2}, CacheMode::kLazy));
  ASSERT_TRUE(cold.status.ok() && warm.status.ok());
  EXPECT_EQ(cold.result.usage.documents_hit, 0);
  EXPECT_EQ(warm.result.usage.documents_hit, 3);
  EXPECT_GT(warm.result.usage.cached_tokens, cold.result.usage.cached_tokens);
  // Same KV, same computation: bit-identical up to chunk boundaries of the query prefill.
  EXPECT_LT(MaxDiff(cold.result.first_logits, warm.result.first_logits), 1e-5f);
  EXPECT_EQ(cold.result.token_ids, warm.result.token_ids);
}

TEST_F(EngineCoreTest, PrefixEqualsFullAndReusesThePrompt) {
  const Outcome full = RunOne(Request({0, 1}, CacheMode::kFull));
  const Outcome prefix_cold = RunOne(Request({0, 1}, CacheMode::kPrefix));
  const Outcome prefix_warm = RunOne(Request({0, 1}, CacheMode::kPrefix));
  ASSERT_TRUE(full.status.ok() && prefix_cold.status.ok() && prefix_warm.status.ok());
  EXPECT_LT(MaxDiff(full.result.first_logits, prefix_cold.result.first_logits), 1e-5f);
  EXPECT_LT(MaxDiff(full.result.first_logits, prefix_warm.result.first_logits), 1e-4f);
  EXPECT_EQ(full.result.token_ids, prefix_warm.result.token_ids);
  // The warm prefix request reuses every whole block of its prompt but the last token's.
  const int64_t prompt = prefix_warm.result.usage.prompt_tokens;
  EXPECT_EQ(prefix_warm.result.usage.cached_tokens, (prompt - 1) / 16 * 16);
  // Swapping the documents defeats prefix caching beyond the system prompt.
  const Outcome swapped = RunOne(Request({1, 0}, CacheMode::kPrefix));
  EXPECT_LT(swapped.result.usage.cached_tokens, 48);
}

TEST_F(EngineCoreTest, FullModeSharesOnlyTheSystemPrefix) {
  RunOne(Request({0}, CacheMode::kFull));
  const Outcome again = RunOne(Request({0}, CacheMode::kFull));
  // "You answer from the documents.\n" is 31 bytes: one whole block of 16 is shared.
  EXPECT_EQ(again.result.usage.cached_tokens, 16);
}

TEST_F(EngineCoreTest, BlockModeCopiesADocumentSeenAtAnotherOffset) {
  RunOne(Request({0, 1}, CacheMode::kBlock));
  const Outcome moved = RunOne(Request({1, 0}, CacheMode::kBlock));
  const Outcome lazy = RunOne(Request({1, 0}, CacheMode::kLazy));
  ASSERT_TRUE(moved.status.ok());
  EXPECT_EQ(core_->stats().mode(CacheMode::kBlock).doc_copies, 2);
  EXPECT_EQ(moved.result.usage.documents_hit, 0);
  EXPECT_LT(MaxDiff(moved.result.first_logits, lazy.result.first_logits), kModeTolerance);
}

TEST_F(EngineCoreTest, ConcurrentRequestsEncodeASharedDocumentOnce) {
  const auto out = Run({Request({4, 5}, CacheMode::kLazy), Request({5, 4}, CacheMode::kLazy),
                        Request({4}, CacheMode::kLazy)});
  for (const auto& o : out) EXPECT_TRUE(o.status.ok()) << o.status;
  EXPECT_EQ(core_->stats().encode_jobs, 2);
}

TEST_F(EngineCoreTest, DocumentsPastSixteenBitOffsetsMatchBlockMode) {
  // 64 documents of 1,100 tokens put the last ones past position 65,535; the 16-bit offsets of the
  // paper's reference implementation would wrap there.
  Init(/*max_positions=*/80000, /*blocks=*/4800, /*max_batch_tokens=*/4096);
  EngineRequest r;
  for (int d = 0; d < 64; ++d) {
    r.documents.push_back({.token_ids = RandomTokens(1100, 1000 + d)});
  }
  r.question = "?";
  r.sampling = {.max_tokens = 4, .ignore_eos = true};
  r.mode = CacheMode::kLazy;
  const Outcome lazy = RunOne(r);
  r.mode = CacheMode::kBlock;
  const Outcome block = RunOne(r);
  ASSERT_TRUE(lazy.status.ok() && block.status.ok()) << lazy.status << block.status;
  EXPECT_GT(lazy.result.usage.prompt_tokens, 70000);
  EXPECT_LT(MaxDiff(lazy.result.first_logits, block.result.first_logits), kModeTolerance);
  EXPECT_EQ(lazy.result.token_ids, block.result.token_ids);
}

TEST_F(EngineCoreTest, SmallBudgetEvictsAndPreemptsWithoutLeaks) {
  // 40 blocks: a request needs ~12; several at once must evict documents and preempt.
  Init(4096, /*blocks=*/40, /*max_batch_tokens=*/32);
  std::vector<EngineRequest> reqs;
  for (int i = 0; i < 8; ++i) reqs.push_back(Request({i % 5, (i + 2) % 5}, CacheMode::kLazy, 40));
  const auto out = Run(reqs);
  for (const auto& o : out) {
    EXPECT_TRUE(o.status.ok()) << o.status;
    EXPECT_EQ(o.result.token_ids.size(), 40u);
  }
  EXPECT_GT(core_->stats().preemptions, 0);
  // Preempted requests recompute and continue: same tokens as when run alone.
  Init(4096, 400, 32);
  EXPECT_EQ(RunOne(reqs[7]).result.token_ids, out[7].result.token_ids);
}

TEST_F(EngineCoreTest, RequestThatCanNeverFitIsRejected) {
  Init(4096, /*blocks=*/8);
  const Outcome o = RunOne(Request({9}, CacheMode::kLazy, 200));
  EXPECT_EQ(o.status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(o.status.message().find("KV blocks"), std::string::npos) << o.status;
}

TEST_F(EngineCoreTest, CancelAndDeadlineFreeEveryBlock) {
  EngineRequest slow = Request({0, 1}, CacheMode::kLazy, 1000);
  EngineRequest late = Request({2}, CacheMode::kLazy, 1000);
  late.deadline = MonotonicNow() + absl::Milliseconds(20);
  std::vector<Outcome> out(2);
  for (int i = 0; i < 2; ++i) {
    auto p = PrepareRequest(i == 0 ? slow : late, *tokenizer_, weights_->config, identity_, {});
    ASSERT_TRUE(p.ok());
    p->callbacks.on_done = [&out, i](const absl::Status& s, const RequestResult& r) {
      out[i] = {s, r};
    };
    core_->Add(std::move(*p), i + 1);
  }
  for (int i = 0; i < 5; ++i) core_->Step(MonotonicNow());
  core_->Cancel(1);
  while (core_->HasWork()) core_->Step(MonotonicNow());
  EXPECT_EQ(out[0].status.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(out[1].status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_GT(out[0].result.token_ids.size(), 0u) << "partial output is reported";
  EXPECT_EQ(core_->cache().pool().num_referenced(), 0);
  EXPECT_TRUE(core_->cache().CheckInvariant().ok());
}

// Greedy continuation computed by hand: one full forward pass per step, no KV reuse, no batching.
std::vector<int32_t> NaiveGreedy(const ModelWeights& w, std::vector<int32_t> seq, int steps) {
  CpuRunner runner(&w);
  std::vector<int32_t> out;
  for (int s = 0; s < steps; ++s) {
    KvCacheCpu kv(w.config, 64);
    std::vector<int64_t> slots(seq.size());
    std::vector<KvBlockEntry> table;
    for (size_t i = 0; i < seq.size(); ++i) slots[i] = static_cast<int64_t>(i);
    for (size_t b = 0; b * 16 < seq.size(); ++b) {
      table.push_back(PackKvBlockEntry(b, 0, std::min<size_t>(16, seq.size() - b * 16)));
    }
    ForwardChunk ch{.tokens = seq, .kv_slots = slots, .block_table = table};
    auto logits = runner.Forward(std::span(&ch, 1), kv);
    EXPECT_TRUE(logits.ok());
    out.push_back(ArgMax(*logits));
    seq.push_back(out.back());
  }
  return out;
}

TEST_F(EngineCoreTest, GreedyMatchesStepByStepRecomputationInEveryMode) {
  // Chunked prefill (budget 64 < prompt), paged decode, batching: same tokens as recomputing
  // the whole sequence at every step. Without documents every mode is plain causal attention.
  EngineRequest r;
  r.question_token_ids = RandomTokens(150, 9);
  r.sampling = {.max_tokens = 12, .ignore_eos = true};
  const auto expected = NaiveGreedy(*weights_, *r.question_token_ids, 12);
  for (CacheMode mode : {CacheMode::kFull, CacheMode::kPrefix, CacheMode::kBlock, CacheMode::kLazy}) {
    r.mode = mode;
    const Outcome o = RunOne(r);
    ASSERT_TRUE(o.status.ok()) << o.status;
    EXPECT_EQ(o.result.token_ids, expected) << CacheModeName(mode);
    EXPECT_EQ(o.result.finish_reason, "length");
  }
}

// Penalties count the question and the output in every mode, never the system prefix or the
// documents, which modes prefix and full carry in the same segment as the question. The first
// token is the argmax of the first logits with only the question's ids penalized (no output
// yet, so frequency and presence change nothing).

}  // namespace
}  // namespace lazyattn
