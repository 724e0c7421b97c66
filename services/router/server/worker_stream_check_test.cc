// The Generate stream's grammar as the router checks it (worker_stream_check.h): every legal shape
// passes, and each kind of break is named.
#include "services/router/server/worker_stream_check.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "services/router/policy/worker_selector.h"

namespace lazyattn::router {
namespace {

using lazyattn::v1::GenerateResponse;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

GenerateResponse Token(int id) {
  GenerateResponse r;
  r.mutable_token()->set_token_id(id);
  r.mutable_token()->set_text("t");
  return r;
}

GenerateResponse WithLogprob(GenerateResponse r, float logprob) {
  r.mutable_token()->set_logprob(logprob);
  return r;
}

GenerateResponse WithText(GenerateResponse r, const std::string& text) {
  r.mutable_token()->set_text(text);
  return r;
}

GenerateResponse WithBytes(GenerateResponse r, const std::string& bytes) {
  r.mutable_token()->set_token_bytes(bytes);
  return r;
}

struct Alternative {
  int id;
  float logprob;
  std::string bytes = "t";
};

GenerateResponse WithAlternatives(GenerateResponse r, const std::vector<Alternative>& entries) {
  for (const Alternative& a : entries) {
    lazyattn::v1::TopLogprob* t = r.mutable_token()->add_top_logprobs();
    t->set_token_id(a.id);
    t->set_logprob(a.logprob);
    t->set_token_bytes(a.bytes);
  }
  return r;
}

GenerateResponse FinalWithCompletionTokens(int64_t n) {
  GenerateResponse r;
  r.mutable_final()->set_finish_reason("stop");
  r.mutable_final()->mutable_usage()->set_completion_tokens(n);
  return r;
}

GenerateResponse Progress(int64_t ready) {
  GenerateResponse r;
  r.mutable_prefill_progress()->set_prompt_tokens_ready(ready);
  return r;
}

GenerateResponse Final() {
  GenerateResponse r;
  r.mutable_final()->set_finish_reason("stop");
  return r;
}

constexpr WorkerStreamCheck::Bounds kBounds{
    .max_tokens = 3, .vocab_size = 1000, .max_context_tokens = 8192, .top_logprobs = 3};

TEST(WorkerStreamCheckTest, BoundsComeFromTheRequestAndTheModel) {
  lazyattn::v1::GenerateRequest request;
  lazyattn::v1::ModelInfo model;
  model.set_vocab_size(49152);
  model.set_max_context_tokens(8192);
  request.mutable_sampling()->set_max_tokens(16);
  WorkerStreamCheck::Bounds b = WorkerStreamCheck::For(request, model, 4096);
  EXPECT_EQ(b.max_tokens, 16);
  EXPECT_EQ(b.vocab_size, 49152);
  EXPECT_EQ(b.max_context_tokens, 8192);
  EXPECT_EQ(b.top_logprobs, 0);
  request.mutable_sampling()->set_logprobs(true);
  request.mutable_sampling()->set_top_logprobs(5);
  EXPECT_EQ(WorkerStreamCheck::For(request, model, 4096).top_logprobs, 5);
  // A worker that does not advertise alternatives (an older one) promises none; one that does,
  // exactly the count asked for, or the whole vocabulary when it is smaller.
  EXPECT_EQ(WorkerStreamCheck::For(request, model, 4096).exact_top_logprobs, 0);
  model.set_max_top_logprobs(20);
  EXPECT_EQ(WorkerStreamCheck::For(request, model, 4096).exact_top_logprobs, 5);
  model.set_vocab_size(3);
  EXPECT_EQ(WorkerStreamCheck::For(request, model, 4096).exact_top_logprobs, 3);
  model.set_vocab_size(49152);
  model.set_max_top_logprobs(4);  // advertises fewer than asked: no promise to hold it to
  EXPECT_EQ(WorkerStreamCheck::For(request, model, 4096).exact_top_logprobs, 0);
  request.mutable_sampling()->set_top_logprobs(-4);  // refused by validation; no entries either
  EXPECT_EQ(WorkerStreamCheck::For(request, model, 4096).top_logprobs, 0);
  // max_tokens 0 is the worker's default, unknown here: the smaller of the context and the
  // router's limits.max_tokens bounds it (a worker's default is within the limit the cluster
  // shares).
  request.mutable_sampling()->set_max_tokens(0);
  EXPECT_EQ(WorkerStreamCheck::For(request, model, 4096).max_tokens, 4096);
  EXPECT_EQ(WorkerStreamCheck::For(request, model, 16384).max_tokens, 8192);
  // A hostile worker's reported context (2^62) does not lift the bound: a stream past the limit
  // would otherwise grow the router's copy of its text for as long as the client waits.
  lazyattn::v1::ModelInfo boundless = model;
  boundless.set_max_context_tokens(int64_t{1} << 62);
  EXPECT_EQ(WorkerStreamCheck::For(request, boundless, 4096).max_tokens, 4096);
  // No router limit (0): the context alone.
  EXPECT_EQ(WorkerStreamCheck::For(request, model, 0).max_tokens, 8192);
  // A worker that never reported its model: no id or context bound, rather than a wrong one;
  // its tokens are bounded by the router's limits.max_tokens, which every request is within.
  b = WorkerStreamCheck::For(request, lazyattn::v1::ModelInfo(), 4096);
  EXPECT_EQ(b.max_tokens, 4096);
  EXPECT_EQ(b.vocab_size, 0);
  EXPECT_EQ(b.max_context_tokens, 0);
  EXPECT_EQ(WorkerStreamCheck::For(request, lazyattn::v1::ModelInfo(), 0).max_tokens, 0);
}

TEST(WorkerStreamCheckTest, EveryLegalShapePasses) {
  {
    WorkerStreamCheck check(kBounds);
    EXPECT_THAT(check.Next(Progress(0)), IsEmpty());
    EXPECT_THAT(check.Next(Progress(8192)), IsEmpty());
    EXPECT_THAT(check.Next(WithLogprob(Token(0), 0.0f)), IsEmpty());  // probability 1
    // Events after the first token are dropped by the attempt, not fatal.
    EXPECT_THAT(check.Next(Progress(100)), IsEmpty());
    EXPECT_THAT(check.Next(Token(999)), IsEmpty());
    EXPECT_THAT(check.Next(Token(5)), IsEmpty());            // max_tokens real tokens
    // then the held-back text (a stop string's worth and more fits the slack)
    EXPECT_THAT(check.Next(WithText(Token(-1), std::string(4096, 'x'))), IsEmpty());
    EXPECT_THAT(check.Next(GenerateResponse()), IsEmpty());  // an event unknown here
    EXPECT_THAT(check.Next(Final()), IsEmpty());
  }
  {
    WorkerStreamCheck check(kBounds);
    EXPECT_THAT(check.Next(Final()), IsEmpty());  // no token at all (an empty answer)
  }
  {
    // Alternatives: up to the request's count, most likely first (ties in any order), ids of the
    // vocabulary, probability 0 as -9999, a rounding above 0 within kMaxLogprob, a token's bytes
    // at their bound, and fewer than asked (a worker from before them sends none).
    WorkerStreamCheck check(kBounds);
    EXPECT_THAT(check.Next(WithAlternatives(WithLogprob(Token(1), 1e-7f),
                                            {{1, 1e-7f}, {0, -1.5f}, {999, -1.5f}})),
                IsEmpty());
    EXPECT_THAT(
        check.Next(WithAlternatives(
            Token(2), {{2, WorkerStreamCheck::kMaxLogprob},
                       {3, -9999.0f, std::string(WorkerStreamCheck::kTextBytesPerToken, 'b')}})),
        IsEmpty());
    EXPECT_THAT(check.Next(Token(3)), IsEmpty());
    EXPECT_THAT(check.Next(Final()), IsEmpty());
  }
  {
    // Nothing known: anything but the order passes.
    WorkerStreamCheck check(WorkerStreamCheck::Bounds{});
    for (int i = 0; i < 10'000; ++i) ASSERT_THAT(check.Next(Token(1 << 30)), IsEmpty());
    EXPECT_THAT(check.Next(Progress(1LL << 40)), IsEmpty());
    EXPECT_THAT(check.Next(Final()), IsEmpty());
  }
}

TEST(WorkerStreamCheckTest, EachBreakIsNamed) {
  struct Case {
    const char* what;
    std::vector<GenerateResponse> stream;  // the last message breaks the grammar
    const char* message;
  };
  const std::vector<Case> cases = {
      {"a token past max_tokens", {Token(1), Token(2), Token(3), Token(4)}, "more than 3 tokens"},
      {"an id past the vocabulary",
       {Token(1000)},
       "token.token_id 1000 outside the model's vocabulary [0, 1000)"},
      {"a negative id", {Token(-2)}, "token.token_id -2 is negative"},
      {"a token after the held-back text",
       {Token(1), Token(-1), Token(2)},
       "token.token_id 2 after the held-back text chunk"},
      {"two held-back texts", {Token(-1), Token(-1)}, "token.token_id -1 twice"},
      {"a NaN log-probability on the held-back chunk",
       {WithLogprob(Token(-1), std::nanf(""))},
       "token.logprob nan is not a finite number"},
      {"text far beyond the tokens'",
       {Token(1), WithText(Token(2), std::string(70'000, 'x'))},
       "token.text: 70001 bytes of text for 2 tokens"},
      {"a negative usage count",
       {Token(1), FinalWithCompletionTokens(-7)},
       "final.usage.completion_tokens -7 is negative"},
      {"a NaN log-probability",
       {WithLogprob(Token(1), std::nanf(""))},
       "token.logprob nan is not a finite number"},
      {"an infinite log-probability",
       {WithLogprob(Token(1), -INFINITY)},
       "token.logprob -inf is not a finite number"},
      {"a token after the final", {Token(1), Final(), Token(2)}, "a message after the final one"},
      {"a second final", {Final(), Final()}, "a message after the final one"},
      {"progress after the final", {Final(), Progress(1)}, "a message after the final one"},
      {"an unknown event after the final",
       {Final(), GenerateResponse()},
       "a message after the final one"},
      {"negative progress", {Progress(-1)}, "prefill_progress.prompt_tokens_ready -1 is negative"},
      {"a token's bytes beyond a token's",
       {Token(1), WithBytes(Token(2), std::string(1025, 'b'))},
       "token.token_bytes: 1025 bytes (a token's bytes are at most 1024)"},
      {"more alternatives than asked for",
       {WithAlternatives(Token(1), {{1, -0.1f}, {2, -0.2f}, {3, -0.3f}, {4, -0.4f}})},
       "token.top_logprobs: 4 entries, more than the request's 3 (sampling.top_logprobs)"},
      {"alternatives on the held-back text chunk",
       {Token(1), WithAlternatives(Token(-1), {{1, -0.1f}})},
       "token.top_logprobs: 1 entries on the held-back text chunk"},
      {"a NaN alternative",
       {WithAlternatives(Token(1), {{1, -0.1f}, {2, std::nanf("")}})},
       "token.top_logprobs[1].logprob nan is not a finite number"},
      {"an infinite alternative",
       {WithAlternatives(Token(1), {{1, -INFINITY}})},
       "token.top_logprobs[0].logprob -inf is not a finite number"},
      {"an alternative above 0",
       {WithAlternatives(Token(1), {{1, 0.5f}})},
       "token.top_logprobs[0].logprob 0.5 is above 0 (not a log-probability)"},
      {"an alternative just past the rounding allowed",
       {WithAlternatives(Token(1), {{1, 2e-3f}})},
       "token.top_logprobs[0].logprob 0.002 is above 0"},
      {"alternatives out of order",
       {WithAlternatives(Token(1), {{1, -0.5f}, {2, -0.25f}})},
       "token.top_logprobs[1].logprob -0.25 above entry 0's -0.5 (the entries come most likely "
       "first)"},
      {"an alternative past the vocabulary",
       {WithAlternatives(Token(1), {{1, -0.1f}, {1000, -0.2f}})},
       "token.top_logprobs[1].token_id 1000 outside the model's vocabulary [0, 1000)"},
      {"a negative alternative id",
       {WithAlternatives(Token(1), {{-1, -0.1f}})},
       "token.top_logprobs[0].token_id -1 is negative"},
      {"an alternative's bytes beyond a token's",
       {WithAlternatives(Token(1), {{1, -0.1f, std::string(1025, 'b')}})},
       "token.top_logprobs[0].token_bytes: 1025 bytes (a token's bytes are at most 1024)"},
      {"progress past the context",
       {Progress(8193)},
       "prefill_progress.prompt_tokens_ready 8193 past the model's context of 8192 tokens"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    WorkerStreamCheck check(kBounds);
    for (size_t i = 0; i + 1 < c.stream.size(); ++i)
      ASSERT_THAT(check.Next(c.stream[i]), IsEmpty());
    EXPECT_THAT(check.Next(c.stream.back()), HasSubstr(c.message));
  }
}

// A request that did not ask for alternatives gets none; the vocabulary, when unknown, bounds
// no id (the other rules still hold).
TEST(WorkerStreamCheckTest, AlternativesNotAskedForAreRefused) {
  WorkerStreamCheck::Bounds none = kBounds;
  none.top_logprobs = 0;
  WorkerStreamCheck check(none);
  EXPECT_THAT(check.Next(Token(1)), IsEmpty());
  EXPECT_EQ(check.Next(WithAlternatives(Token(2), {{2, -0.1f}})),
            "token.top_logprobs: 1 entries, but the request asked for none (sampling.top_logprobs "
            "0)");

  WorkerStreamCheck unknown_vocabulary(WorkerStreamCheck::Bounds{.top_logprobs = 2});
  EXPECT_THAT(unknown_vocabulary.Next(WithAlternatives(Token(5), {{1 << 30, -0.1f}, {7, -0.2f}})),
              IsEmpty());
  EXPECT_THAT(unknown_vocabulary.Next(WithAlternatives(Token(6), {{7, -0.2f}, {8, -0.1f}})),
              HasSubstr("token.top_logprobs[1].logprob -0.1 above entry 0's -0.2"));
}

// A worker that advertises alternatives sends exactly the count asked for on every real token:
// one that sends fewer, or none, breaks its promise (a client reading entry [k - 1] would fail).
TEST(WorkerStreamCheckTest, AnAdvertisingWorkerSendsExactlyTheCount) {
  WorkerStreamCheck::Bounds exact = kBounds;
  exact.top_logprobs = 2;
  exact.exact_top_logprobs = 2;
  WorkerStreamCheck check(exact);
  EXPECT_THAT(check.Next(WithAlternatives(Token(1), {{1, -0.1f}, {2, -0.2f}})), IsEmpty());
  EXPECT_EQ(check.Next(WithAlternatives(Token(2), {{2, -0.1f}})),
            "token.top_logprobs: 1 entries, the request's 2 expected (sampling.top_logprobs; the "
            "worker advertises them)");
  WorkerStreamCheck none_sent(exact);
  EXPECT_THAT(none_sent.Next(Token(1)), HasSubstr("token.top_logprobs: 0 entries"));
  // The held-back text chunk carries none, as always.
  WorkerStreamCheck held_back(exact);
  EXPECT_THAT(held_back.Next(WithAlternatives(Token(1), {{1, -0.1f}, {2, -0.2f}})), IsEmpty());
  EXPECT_THAT(held_back.Next(Token(-1)), IsEmpty());
}

// All the alternatives' bytes together are bounded as the text is (1 KiB a token on average,
// plus the slack): 20 alternatives of 1 KiB each on every token would otherwise let a stream
// hold 20 times the text's bytes. Short tokens far below the bound pass.
TEST(WorkerStreamCheckTest, AlternativesBytesAreBoundedAsTheText) {
  WorkerStreamCheck::Bounds b{.max_tokens = 1000, .vocab_size = 1000, .top_logprobs = 20};
  std::vector<Alternative> short_ones, long_ones;
  for (int i = 0; i < 20; ++i) {
    short_ones.push_back({i, -1.0f - i, std::string(16, 'a')});
    long_ones.push_back({i, -1.0f - i, std::string(1024, 'a')});
  }
  WorkerStreamCheck fine(b);
  for (int t = 0; t < 200; ++t)
    ASSERT_THAT(fine.Next(WithAlternatives(Token(1), short_ones)), IsEmpty());
  WorkerStreamCheck bloated(b);
  std::string error;
  int t = 0;
  for (; t < 100 && error.empty(); ++t) error = bloated.Next(WithAlternatives(Token(1), long_ones));
  // 20 KiB a token against 1 KiB a token plus 64 KiB: the fourth token is over.
  EXPECT_EQ(t, 4);
  EXPECT_THAT(error, HasSubstr("token.top_logprobs: 81920 bytes of alternatives for 4 tokens"));
}

// A usage count past any model (INT64_MAX from a hostile worker) is relayed as 2^40, so the sums
// the router makes of them (choices, prompt and completion) cannot overflow; the rest as sent.
TEST(ClampUsageTest, CountsPastAnyModelAreCutTo2To40) {
  constexpr int64_t kHuge = std::numeric_limits<int64_t>::max();
  lazyattn::v1::Usage usage;
  usage.set_prompt_tokens(kHuge);
  usage.set_completion_tokens(7);
  usage.set_document_hit_tokens(kHuge);
  ClampUsage(usage);
  EXPECT_EQ(usage.prompt_tokens(), kMaxObservedTokens);
  EXPECT_EQ(usage.completion_tokens(), 7);
  EXPECT_EQ(usage.document_hit_tokens(), kMaxObservedTokens);
  EXPECT_FALSE(usage.has_document_copied_tokens()) << "absent stays absent (an older worker)";
  usage.set_document_copied_tokens(kHuge);
  ClampUsage(usage);
  EXPECT_EQ(usage.document_copied_tokens(), kMaxObservedTokens);
}

}  // namespace
}  // namespace lazyattn::router
#include "services/router/policy/worker_selector.h"
