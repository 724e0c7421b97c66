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
#include "services/worker/engine/kv_cache_cpu.h"
#include "services/worker/engine/request_prep.h"
#include "services/worker/model/model_fingerprint.h"
#include "services/worker/model/random_weights.h"
#include "services/worker/model/tokenizer/byte_tokenizer.h"

namespace lazyattn {
namespace {

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
    core_ = std::make_unique<EngineCore>(
        weights_.get(), tokenizer_.get(),
        EngineOptions{.num_kv_blocks = blocks, .max_batch_tokens = max_batch_tokens,
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
      r.documents.push_back({.id = "doc" + std::to_string(d),
                             .token_ids = RandomTokens(17 + 13 * d, 100 + d)});
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
TEST_F(EngineCoreTest, PenaltiesCountTheQuestionAndOutputInEveryMode) {
  for (int docs = 0; docs < 3; ++docs) {
    for (CacheMode mode :
         {CacheMode::kFull, CacheMode::kPrefix, CacheMode::kBlock, CacheMode::kLazy}) {
      SCOPED_TRACE(::testing::Message() << CacheModeName(mode) << " docs " << docs);
      EngineRequest r = Request({docs, docs + 3}, mode, 2);
      r.sampling.repetition_penalty = 3.0f;
      r.sampling.frequency_penalty = 2.0f;
      r.sampling.presence_penalty = 2.0f;
      const Outcome o = RunOne(r);
      ASSERT_TRUE(o.status.ok()) << o.status;
      std::vector<float> x = o.result.first_logits;
      ASSERT_EQ(x.size(), size_t(weights_->config.vocab_size));
      auto prepared = PrepareRequest(r, *tokenizer_, weights_->config, identity_, {});
      ASSERT_TRUE(prepared.ok()) << prepared.status();
      const std::vector<int32_t>& question = prepared->question;
      ASSERT_FALSE(question.empty());
      for (int32_t id : std::set<int32_t>(question.begin(), question.end())) {
        x[id] = x[id] > 0 ? x[id] / 3.0f : x[id] * 3.0f;
      }
      EXPECT_EQ(o.result.token_ids.at(0), ArgMax(x));
    }
  }
}

TEST_F(EngineCoreTest, StreamedTextIsTheDecodedTokens) {
  EngineRequest r = Request({0}, CacheMode::kLazy, 20);
  r.sampling.temperature = 0.8f;
  r.sampling.seed = 9;
  auto p = PrepareRequest(r, *tokenizer_, weights_->config, identity_, {});
  ASSERT_TRUE(p.ok());
  std::string streamed;
  Outcome out;
  p->callbacks.on_token = [&](int32_t, std::string_view text) { streamed += text; };
  p->callbacks.on_done = [&](const absl::Status& s, const RequestResult& res) { out = {s, res}; };
  core_->Add(std::move(*p));
  while (core_->HasWork()) core_->Step(MonotonicNow());
  ASSERT_TRUE(out.status.ok());
  EXPECT_EQ(out.result.token_ids.size(), 20u);
  EXPECT_EQ(streamed, out.result.text);
  auto decoded = tokenizer_->Decode(out.result.token_ids);
  ASSERT_TRUE(decoded.ok());
  EXPECT_EQ(out.result.text, *decoded);
}

// A prompt longer than one step reports its progress after each step before the first token
// (the worker's sign of life to the router while a long prefill runs): increasing counts, all
// before the first token, never once the tokens flow. Its documents are encoded by jobs, whose
// steps count for the request too.
TEST_F(EngineCoreTest, PrefillProgressComesBeforeTheFirstToken) {
  Init(/*max_positions=*/4096, /*blocks=*/256, /*max_batch_tokens=*/16);
  auto p = PrepareRequest(Request({0, 1, 2}, CacheMode::kLazy, 4), *tokenizer_, weights_->config,
                          identity_, {});
  ASSERT_TRUE(p.ok());
  std::vector<int64_t> progress;
  int tokens = 0;
  int progress_after_tokens = 0;
  Outcome out;
  p->callbacks.on_prefill_progress = [&](int64_t ready) {
    progress.push_back(ready);
    if (tokens > 0) ++progress_after_tokens;
  };
  p->callbacks.on_token = [&](int32_t, std::string_view) { ++tokens; };
  p->callbacks.on_done = [&](const absl::Status& s, const RequestResult& res) { out = {s, res}; };
  core_->Add(std::move(*p));
  while (core_->HasWork()) core_->Step(MonotonicNow());
  ASSERT_TRUE(out.status.ok()) << out.status;
  const int64_t prompt = out.result.usage.prompt_tokens;
  // 16 tokens a step over a prompt of ~130 tokens: several steps before the first token.
  ASSERT_GT(prompt, 5 * 16);
  EXPECT_GE(progress.size(), static_cast<size_t>(prompt / 16 - 1));
  EXPECT_EQ(progress_after_tokens, 0);
  EXPECT_TRUE(std::is_sorted(progress.begin(), progress.end()));
  EXPECT_GT(progress.front(), 0);
  EXPECT_LT(progress.back(), prompt);  // the step that completes the prompt gives a token instead
  EXPECT_EQ(tokens, 4);
}

// With sampling.logprobs every generated token comes with its log-probability, in the result
// and through on_logprob just before its on_token; the first one is log_softmax of the first
// logits (no penalties) at the drawn token.
TEST_F(EngineCoreTest, LogprobsFollowEachTokenWhenAsked) {
  EngineRequest r = Request({0}, CacheMode::kLazy, 12);
  r.sampling.temperature = 1.0f;
  r.sampling.seed = 4;
  r.sampling.logprobs = true;
  auto p = PrepareRequest(r, *tokenizer_, weights_->config, identity_, {});
  ASSERT_TRUE(p.ok());
  std::vector<float> streamed;
  std::vector<int32_t> streamed_ids;
  int pending = 0;  // on_logprob calls not yet followed by their on_token
  Outcome out;
  p->callbacks.on_logprob = [&](float lp, std::span<const TopLogprob> top) {
    EXPECT_TRUE(top.empty());  // none asked
    streamed.push_back(lp);
    ++pending;
  };
  p->callbacks.on_token = [&](int32_t id, std::string_view) {
    if (id < 0) return;  // the final flush carries no token
    EXPECT_EQ(pending, 1);
    pending = 0;
    streamed_ids.push_back(id);
  };
  p->callbacks.on_done = [&](const absl::Status& s, const RequestResult& res) { out = {s, res}; };
  core_->Add(std::move(*p));
  while (core_->HasWork()) core_->Step(MonotonicNow());
  ASSERT_TRUE(out.status.ok());
  ASSERT_EQ(out.result.token_ids.size(), 12u);
  EXPECT_EQ(streamed_ids, out.result.token_ids);
  EXPECT_EQ(streamed, out.result.logprobs);
  const std::vector<float>& x = out.result.first_logits;
  ASSERT_EQ(x.size(), size_t(weights_->config.vocab_size));
  const double mx = *std::max_element(x.begin(), x.end());
  double z = 0;
  for (float v : x) z += std::exp(double(v) - mx);
  const double want = double(x[out.result.token_ids[0]]) - mx - std::log(z);
  EXPECT_NEAR(out.result.logprobs[0], want, 1e-4);
  for (float lp : out.result.logprobs) EXPECT_LE(lp, 0.0f);

  // Not asked: none.
  r.sampling.logprobs = false;
  EXPECT_TRUE(RunOne(r).result.logprobs.empty());
}

// With sampling.top_logprobs = k every generated token comes with the k most likely tokens of the
// draw's softmax, streamed with its logprob. The first list is log_softmax of the first logits
// (the frequency penalty counts output only, so it has nothing to change yet); every list is
// ranked, and holds the drawn token with exactly its logprob whenever that token ranks inside.
// Asking for them changes no token.
TEST_F(EngineCoreTest, TopLogprobsRankEachPositionAndChangeNoToken) {
  EngineRequest r = Request({0}, CacheMode::kLazy, 10);
  r.sampling.temperature = 1.0f;
  r.sampling.seed = 9;
  r.sampling.frequency_penalty = 1.5f;
  r.sampling.logprobs = true;
  const Outcome plain = RunOne(r);
  ASSERT_TRUE(plain.status.ok());
  EXPECT_TRUE(plain.result.top_logprobs.empty());

  constexpr int kTop = 5;
  r.sampling.top_logprobs = kTop;
  const Outcome kept = RunOne(r);  // no on_logprob: the result keeps the lists
  ASSERT_TRUE(kept.status.ok());
  auto p = PrepareRequest(r, *tokenizer_, weights_->config, identity_, {});
  ASSERT_TRUE(p.ok());
  std::vector<std::vector<TopLogprob>> streamed;
  Outcome out;
  p->callbacks.on_logprob = [&](float, std::span<const TopLogprob> top) {
    streamed.emplace_back(top.begin(), top.end());
  };
  p->callbacks.on_done = [&](const absl::Status& s, const RequestResult& res) { out = {s, res}; };
  core_->Add(std::move(*p));
  while (core_->HasWork()) core_->Step(MonotonicNow());
  ASSERT_TRUE(out.status.ok());
  // Streamed through on_logprob, they are not kept in the result too.
  EXPECT_TRUE(out.result.top_logprobs.empty());
  EXPECT_EQ(out.result.token_ids, kept.result.token_ids);
  const RequestResult& res = kept.result;
  EXPECT_EQ(res.token_ids, plain.result.token_ids);
  // The same up to rounding: the first run encoded the document, this one reuses its KV.
  ASSERT_EQ(res.logprobs.size(), plain.result.logprobs.size());
  for (size_t t = 0; t < res.logprobs.size(); ++t) {
    EXPECT_NEAR(res.logprobs[t], plain.result.logprobs[t], 1e-4) << "token " << t;
  }
  ASSERT_EQ(res.top_logprobs.size(), res.token_ids.size());
  ASSERT_EQ(streamed.size(), res.token_ids.size());
  int inside = 0;
  for (size_t t = 0; t < res.token_ids.size(); ++t) {
    const std::vector<TopLogprob>& top = res.top_logprobs[t];
    ASSERT_EQ(top.size(), size_t(kTop)) << "token " << t;
    for (size_t i = 0; i < top.size(); ++i) {
      EXPECT_EQ(top[i].token_id, streamed[t][i].token_id);
      EXPECT_EQ(top[i].logprob, streamed[t][i].logprob);
      EXPECT_LE(top[i].logprob, 0.0f);
      if (i > 0) {
        EXPECT_LE(top[i].logprob, top[i - 1].logprob) << "token " << t;
      }
    }
    const auto drawn = std::find_if(top.begin(), top.end(), [&](const TopLogprob& e) {
      return e.token_id == res.token_ids[t];
    });
    if (drawn != top.end()) {
      EXPECT_EQ(drawn->logprob, res.logprobs[t]) << "token " << t;
      ++inside;
    } else {
      EXPECT_LE(res.logprobs[t], top.back().logprob) << "token " << t << " ranks inside";
    }
  }
  EXPECT_GT(inside, 0);
  // The first position against an independent log_softmax of the first logits.
  const std::vector<float>& x = res.first_logits;
  ASSERT_EQ(x.size(), size_t(weights_->config.vocab_size));
  const double mx = *std::max_element(x.begin(), x.end());
  double z = 0;
  for (float v : x) z += std::exp(double(v) - mx);
  std::vector<int32_t> ids(x.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return x[a] > x[b]; });
  for (int i = 0; i < kTop; ++i) {
    EXPECT_EQ(res.top_logprobs[0][i].token_id, ids[i]) << "entry " << i;
    EXPECT_NEAR(res.top_logprobs[0][i].logprob, double(x[ids[i]]) - mx - std::log(z), 1e-4);
  }
}

TEST_F(EngineCoreTest, StopTokensAndStopStringsEndGeneration) {
  EngineRequest r = Request({1}, CacheMode::kLazy, 16);
  const Outcome full = RunOne(r);
  ASSERT_GE(full.result.token_ids.size(), 4u);
  // A stop token ends generation before it (it is not returned).
  r.sampling.stop_token_ids = {full.result.token_ids[2]};
  Outcome o = RunOne(r);
  const auto first = std::find(full.result.token_ids.begin(), full.result.token_ids.end(),
                               full.result.token_ids[2]);
  EXPECT_EQ(o.result.token_ids, std::vector<int32_t>(full.result.token_ids.begin(), first));
  EXPECT_EQ(o.result.finish_reason, "stop");
  // A stop string cuts the text before it.
  ASSERT_GE(full.result.text.size(), 4u);
  const std::string stop = full.result.text.substr(2, 2);
  r.sampling.stop_token_ids.clear();
  r.sampling.stop = {stop};
  o = RunOne(r);
  EXPECT_EQ(o.result.finish_reason, "stop");
  EXPECT_EQ(o.result.text, full.result.text.substr(0, full.result.text.find(stop)));
}

TEST_F(EngineCoreTest, BadInputIsRejectedNamingTheField) {
  auto prep = [&](const EngineRequest& r) {
    return PrepareRequest(r, *tokenizer_, weights_->config, identity_, {.max_documents = 4});
  };
  EngineRequest r = Request({0}, CacheMode::kLazy);
  r.documents[0] = {.id = "empty", .text = ""};
  // The field comes first (the HTTP API's `param`), the document's id last.
  EXPECT_EQ(prep(r).status().message(), "documents[0].text: empty document (document \"empty\")");
  r = Request({0, 1, 2, 3, 4}, CacheMode::kLazy);
  EXPECT_NE(prep(r).status().message().find("documents: 5 documents exceed the limit of 4"),
            std::string::npos);
  r = Request({0}, CacheMode::kLazy);
  r.documents[0].token_ids = std::vector<int32_t>(5000, 1);
  EXPECT_THAT(std::string(prep(r).status().message()),
              ::testing::StartsWith("documents[0].tokens: 5000 tokens exceed the model's context"));
  r.documents[0].token_ids = std::vector<int32_t>{1, 999};
  EXPECT_THAT(std::string(prep(r).status().message()),
              ::testing::StartsWith("documents[0].tokens.ids[1]: 999 is outside the vocabulary"));
  r = Request({0}, CacheMode::kLazy);
  r.question = "";
  EXPECT_NE(prep(r).status().message().find("question"), std::string::npos);
  r = Request({0}, CacheMode::kLazy);
  r.sampling.top_p = 2;
  EXPECT_NE(prep(r).status().message().find("top_p"), std::string::npos);
  EXPECT_EQ(ParseCacheMode("radix").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(ParseCacheMode("radix").status().message().find("radix"), std::string::npos);
}

// The CPU runner behind the pipelined-decode interface (ModelRunner::Launch/Collect), computing
// at Launch: what the CUDA backend's pipelining asks of the engine, checked without a GPU. A
// chained launch takes chunk i's token from row previous_step_rows[i] of the step launched just
// before, as the CUDA runner does on the device; every `fail_every`-th chained launch fails.
class PipeliningCpuRunner final : public ModelRunner {
 public:
  PipeliningCpuRunner(const ModelWeights* weights, int64_t blocks, int fail_every)
      : inner_(weights, blocks), fail_every_(fail_every) {}
  const ModelConfig& config() const override { return inner_.config(); }
  std::string backend_name() const override { return "cpu-pipelining"; }
  int64_t num_kv_blocks() const override { return inner_.num_kv_blocks(); }
  absl::StatusOr<ForwardOutput> Forward(std::span<const ForwardChunk> chunks) override {
    EXPECT_TRUE(launched_.empty()) << "Forward with a launched step uncollected";
    last_greedy_.clear();
    auto out = inner_.Forward(chunks);
    if (out.ok()) Record(*out);
    return out;
  }
  absl::Status CopyBlocks(std::span<const BlockCopy> copies) override {
    EXPECT_TRUE(launched_.empty()) << "CopyBlocks with a launched step uncollected";
    return inner_.CopyBlocks(copies);
  }
  bool SupportsPipelinedDecode() const override { return true; }
  absl::Status Launch(std::span<const ForwardChunk> chunks,
                      std::span<const int32_t> previous_step_rows) override {
    EXPECT_LT(launched_.size(), 2u);
    std::vector<ForwardChunk> own(chunks.begin(), chunks.end());
    std::vector<int32_t> tokens(own.size());
    if (!previous_step_rows.empty()) {
      if (fail_every_ > 0 && ++chained_tries_ % fail_every_ == 0) {
        return absl::InternalError("injected launch failure");
      }
      EXPECT_EQ(previous_step_rows.size(), own.size());
      for (size_t i = 0; i < own.size(); ++i) {
        EXPECT_LT(static_cast<size_t>(previous_step_rows[i]), last_greedy_.size());
        tokens[i] = last_greedy_.at(previous_step_rows[i]);
        own[i].tokens = std::span(&tokens[i], 1);
        // As the CUDA runner: the history lacks the input token drawn "on the device".
        if (HasPenalties(own[i].sampling)) own[i].sampling.flags |= kCountInputToken;
      }
      ++chained_;
    }
    auto out = inner_.Forward(own);
    if (!out.ok()) return out.status();
    Record(*out);
    last_greedy_ = out->token_ids;
    launched_.push_back(*std::move(out));
    return absl::OkStatus();
  }
  absl::StatusOr<ForwardOutput> Collect() override {
    if (launched_.empty()) return absl::FailedPreconditionError("nothing launched");
    ForwardOutput out = std::move(launched_.front());
    launched_.pop_front();
    return out;
  }
  int chained() const { return chained_; }
  // Every logits row returned (return_logits chunks), in the order the steps ran.
  const std::vector<std::vector<float>>& returned_rows() const { return returned_rows_; }

 private:
  void Record(const ForwardOutput& out) {
    const size_t V = static_cast<size_t>(config().vocab_size);
    for (size_t at = 0; at + V <= out.logits.size(); at += V) {
      returned_rows_.emplace_back(out.logits.begin() + at, out.logits.begin() + at + V);
    }
  }
  CpuModelRunner inner_;
  int fail_every_;
  int chained_tries_ = 0, chained_ = 0;
  std::vector<int32_t> last_greedy_;
  std::deque<ForwardOutput> launched_;
  std::vector<std::vector<float>> returned_rows_;
};

// Pipelined decode (EngineOptions::pipeline_decode) generates what step-by-step decode does, in
// the modes with documents: requests that finish at different steps (by length while the next
// step is in flight, or on a stop token, whose row of the chained step is dropped), one that joins
// mid-run, one cancelled mid-run, chained launches that fail (the engine falls back to an
// ordinary step). The pool's invariant holds afterwards.
TEST_F(EngineCoreTest, PipelinedDecodeMatchesStepByStepDecode) {
  struct Result {
    absl::Status status;
    RequestResult result;
  };
  const std::vector<int> max_tokens = {3, 9, 20, 20, 26, 30};
  constexpr size_t kJoiner = 5, kCancelled = 4, kStopped = 2;
  auto run = [&](CacheMode mode, bool pipeline, int fail_every, int32_t stop_token,
                 int* chained) {
    auto runner = std::make_unique<PipeliningCpuRunner>(weights_.get(), 512, fail_every);
    PipeliningCpuRunner* raw = runner.get();
    EngineCore core(std::move(runner), tokenizer_.get(),
                    {.max_batch_tokens = 512, .pipeline_decode = pipeline});
    std::vector<Result> out(max_tokens.size());
    std::vector<uint64_t> ids(max_tokens.size());
    auto add = [&](size_t i) {
      EngineRequest r = Request({static_cast<int>(i % 3), static_cast<int>(3 + i % 2)}, mode,
                                max_tokens[i]);
      if (i == kStopped && stop_token >= 0) r.sampling.stop_token_ids = {stop_token};
      auto p = PrepareRequest(r, *tokenizer_, weights_->config, identity_, {});
      EXPECT_TRUE(p.ok()) << p.status();
      p->callbacks.on_done = [&out, i](const absl::Status& st, const RequestResult& res) {
        out[i] = {st, res};
      };
      ids[i] = core.Add(std::move(*p));
    };
    for (size_t i = 0; i < max_tokens.size(); ++i) {
      if (i != kJoiner) add(i);
    }
    for (int step = 0; core.HasWork() && step < 10000; ++step) {
      if (step == 6) add(kJoiner);
      if (step == 12) core.Cancel(ids[kCancelled]);
      core.Step(MonotonicNow());
    }
    EXPECT_FALSE(core.HasWork()) << "the engine did not drain";
    EXPECT_TRUE(core.cache().CheckInvariant().ok()) << core.cache().CheckInvariant();
    *chained = raw->chained();
    return out;
  };
  for (CacheMode mode : {CacheMode::kLazy, CacheMode::kBlock}) {
    SCOPED_TRACE(::testing::Message() << "mode " << CacheModeName(mode));
    int chained = 0;
    // Request kStopped's 6th token, from a run without stop tokens, becomes its stop token.
    const std::vector<Result> plain = run(mode, false, 0, -1, &chained);
    ASSERT_TRUE(plain[kStopped].status.ok()) << plain[kStopped].status;
    ASSERT_GE(plain[kStopped].result.token_ids.size(), 6u);
    const int32_t stop = plain[kStopped].result.token_ids[5];
    const std::vector<Result> want = run(mode, false, 0, stop, &chained);
    EXPECT_EQ(chained, 0);
    EXPECT_EQ(want[kStopped].result.finish_reason, "stop");
    EXPECT_EQ(want[kCancelled].status.code(), absl::StatusCode::kCancelled);
    for (int fail_every : {0, 5}) {
      SCOPED_TRACE(::testing::Message() << "fail_every " << fail_every);
      const std::vector<Result> got = run(mode, true, fail_every, stop, &chained);
      EXPECT_GT(chained, 10) << "no step was chained";
      for (size_t i = 0; i < max_tokens.size(); ++i) {
        SCOPED_TRACE(::testing::Message() << "request " << i);
        EXPECT_EQ(got[i].status.code(), want[i].status.code()) << got[i].status;
        EXPECT_EQ(got[i].result.finish_reason, want[i].result.finish_reason);
        // Where a cancellation lands depends on the step it meets.
        if (i != kCancelled) {
          EXPECT_EQ(got[i].result.token_ids, want[i].result.token_ids);
        }
      }
    }
  }
}

// A request that wants top_logprobs brings its rows' logits back every step, and its steps stay
// pipelined: the lists of chained steps are those of step-by-step decode, beside a request that
// asked for none. The second run draws with penalties: in a chained step the runner counts the
// input token it drew itself (kCountInputToken) and the host ranks with a history that holds it,
// so both must agree for the lists to match. The third adds a logit bias, which chained steps
// must carry on as the first step of each request had it.
TEST_F(EngineCoreTest, TopLogprobsStayPipelined) {
  std::vector<int32_t> question;  // request 0's
  SamplingParams sampling0;
  auto run = [&](bool pipeline, bool penalties, bool bias, int* chained,
                 std::vector<std::vector<float>>* rows) {
    auto runner = std::make_unique<PipeliningCpuRunner>(weights_.get(), 512, /*fail_every=*/0);
    PipeliningCpuRunner* raw = runner.get();
    EngineCore core(std::move(runner), tokenizer_.get(),
                    {.max_batch_tokens = 512, .pipeline_decode = pipeline});
    std::vector<RequestResult> out(2);
    for (int i = 0; i < 2; ++i) {
      EngineRequest r = Request({i, 3}, CacheMode::kLazy, 16);
      r.sampling.logprobs = true;
      r.sampling.top_logprobs = i == 0 ? kMaxTopLogprobs : 0;
      if (penalties) {
        r.sampling.temperature = 0.7f;
        r.sampling.seed = 3 + i;
        r.sampling.repetition_penalty = 1.4f;
        r.sampling.frequency_penalty = 1.0f;
        r.sampling.presence_penalty = 0.5f;
      }
      if (bias) r.sampling.logit_bias = {{3, 2.0f}, {17, -1.5f}, {40 + i, 4.0f}};
      auto p = PrepareRequest(r, *tokenizer_, weights_->config, identity_, {});
      EXPECT_TRUE(p.ok()) << p.status();
      if (i == 0) question = p->question, sampling0 = r.sampling;
      p->callbacks.on_done = [&out, i](const absl::Status& st, const RequestResult& res) {
        EXPECT_TRUE(st.ok()) << st;
        out[i] = res;
      };
      core.Add(std::move(*p));
    }
    for (int step = 0; core.HasWork() && step < 1000; ++step) core.Step(MonotonicNow());
    EXPECT_FALSE(core.HasWork());
    *chained = raw->chained();
    *rows = raw->returned_rows();  // request 0's only: the other asks for no alternatives
    return out;
  };
  // Request 0's lists against a log_softmax in double of each returned row, penalized here with
  // the history that position's draw saw: the question, then the tokens before it.
  auto expect_reference = [&](const RequestResult& res,
                              const std::vector<std::vector<float>>& rows) {
    ASSERT_EQ(rows.size(), res.token_ids.size());
    for (size_t t = 0; t < rows.size(); ++t) {
      std::vector<int32_t> history = question;
      history.insert(history.end(), res.token_ids.begin(), res.token_ids.begin() + t);
      const SamplingRowParams row = RowSamplingParams(sampling0, t);
      std::vector<double> x(rows[t].begin(), rows[t].end());
      for (const PenaltyEntry& e :
           RowAdjustments(row, history, question.size(), sampling0.logit_bias)) {
        x[e.id] = PenalizedLogit(rows[t][e.id], row, e);
      }
      const double mx = *std::max_element(x.begin(), x.end());
      double z = 0;
      for (double v : x) z += std::exp(v - mx);
      std::vector<int32_t> order(x.size());
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(),
                       [&](int32_t a, int32_t b) { return x[a] > x[b]; });
      for (size_t i = 0; i < res.top_logprobs[t].size(); ++i) {
        EXPECT_EQ(res.top_logprobs[t][i].token_id, order[i]) << "token " << t << " entry " << i;
        EXPECT_NEAR(res.top_logprobs[t][i].logprob, x[order[i]] - mx - std::log(z), 1e-4)
            << "token " << t << " entry " << i;
      }
    }
  };
  for (int mode = 0; mode < 3; ++mode) {
    const bool penalties = mode >= 1, bias = mode == 2;
    SCOPED_TRACE(::testing::Message() << "penalties " << penalties << " bias " << bias);
    int chained = 0;
    std::vector<std::vector<float>> want_rows, got_rows;
    const std::vector<RequestResult> want = run(false, penalties, bias, &chained, &want_rows);
    const std::vector<RequestResult> got = run(true, penalties, bias, &chained, &got_rows);
    EXPECT_GT(chained, 5) << "no step was chained";
    expect_reference(want[0], want_rows);
    expect_reference(got[0], got_rows);
    ASSERT_EQ(want[0].top_logprobs.size(), 16u);
    EXPECT_TRUE(want[1].top_logprobs.empty());
    EXPECT_TRUE(got[1].top_logprobs.empty());
    EXPECT_EQ(got[0].token_ids, want[0].token_ids);
    EXPECT_EQ(got[1].token_ids, want[1].token_ids);
    ASSERT_EQ(got[0].top_logprobs.size(), want[0].top_logprobs.size());
    int drawn_in_list = 0;
    for (size_t t = 0; t < want[0].top_logprobs.size(); ++t) {
      ASSERT_EQ(got[0].top_logprobs[t].size(), size_t(kMaxTopLogprobs)) << "token " << t;
      for (size_t i = 0; i < size_t(kMaxTopLogprobs); ++i) {
        EXPECT_EQ(got[0].top_logprobs[t][i].token_id, want[0].top_logprobs[t][i].token_id);
        EXPECT_NEAR(got[0].top_logprobs[t][i].logprob, want[0].top_logprobs[t][i].logprob, 1e-5);
        if (got[0].top_logprobs[t][i].token_id == got[0].token_ids[t]) {
          EXPECT_EQ(got[0].top_logprobs[t][i].logprob, got[0].logprobs[t]);
          ++drawn_in_list;
        }
      }
      // Greedy: the drawn token heads its list.
      if (!penalties) {
        EXPECT_EQ(got[0].top_logprobs[t][0].token_id, got[0].token_ids[t]);
      }
    }
    EXPECT_GT(drawn_in_list, 0);
  }
}

}  // namespace
}  // namespace lazyattn
