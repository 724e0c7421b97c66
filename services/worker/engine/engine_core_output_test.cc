// What the engine core emits on a tiny random model: penalties, streamed text, progress before
// the first token, logprobs and their alternatives, stops, and the refusal of bad input.
#include <algorithm>
#include <cmath>
#include <deque>
#include <numeric>
#include <random>
#include <set>

#include "common/monotonic_time.h"
#include "common/utf8.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/worker/engine/cpu_runner.h"
#include "services/worker/engine/engine_core.h"
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
  // Bytes that can never be UTF-8 come out as U+FFFD, as the client gets them.
  EXPECT_EQ(out.result.text, ToValidUtf8(*decoded));
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

// A byte that can never be UTF-8 reaches the client as U+FFFD; a stop string holding U+FFFD
// matches it. The matcher used to see the raw byte, so such a stop string never matched and
// generation ran to max_tokens.
TEST_F(EngineCoreTest, AStopStringOfTheReplacementCharacterMatchesABrokenByte) {
  EngineRequest r = Request({1}, CacheMode::kLazy, 5);
  r.sampling.logit_bias = {{0xA5, 100.0f}};  // the byte tokenizer's lone continuation byte 0xA5
  const std::string replacement = "\xEF\xBF\xBD";
  Outcome o = RunOne(r);
  ASSERT_TRUE(o.status.ok()) << o.status;
  EXPECT_EQ(o.result.token_ids, std::vector<int32_t>(5, 0xA5));
  EXPECT_EQ(o.result.text, replacement + replacement + replacement + replacement + replacement);
  EXPECT_EQ(o.result.finish_reason, "length");
  r.sampling.stop = {replacement};
  o = RunOne(r);
  ASSERT_TRUE(o.status.ok()) << o.status;
  EXPECT_EQ(o.result.text, "");
  EXPECT_EQ(o.result.finish_reason, "stop");
  EXPECT_EQ(o.result.token_ids.size(), 1u);
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

}  // namespace
}  // namespace lazyattn
