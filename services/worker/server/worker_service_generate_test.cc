// What a Generate stream returns: its tokens, then a final message with the usage; unseeded
// requests differ while a seed repeats; log-probabilities come with each token only when asked.
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lazyattn/v1/worker.grpc.pb.h"
#include "services/worker/server/worker_service.h"
#include "services/worker/server/worker_service_test_fixture.h"

namespace lazyattn {
namespace {

using testing::kDocs;
using testing::MetricValue;
using testing::StreamResult;
using testing::WorkerServiceTest;

TEST_F(WorkerServiceTest, StreamsTokensThenFinalWithUsage) {
  StartServer();
  const StreamResult r = Generate(Request(kDocs, 8));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  int tokens = 0;
  for (const v1::TokenChunk& c : r.chunks) tokens += c.token_id() >= 0 ? 1 : 0;
  EXPECT_EQ(tokens, 8);
  ASSERT_TRUE(r.final.has_value());
  EXPECT_EQ(r.final->finish_reason(), "length");
  EXPECT_EQ(r.final->worker(), "worker-under-test");
  EXPECT_EQ(r.final->attempts(), 1);
  EXPECT_EQ(r.final->text(), r.text);
  EXPECT_GT(r.final->ttft_ms(), 0);
  const v1::Usage& u = r.final->usage();
  EXPECT_EQ(u.completion_tokens(), 8);
  EXPECT_EQ(u.documents(), 3);
  EXPECT_EQ(u.documents_hit(), 0);
  EXPECT_GT(u.prompt_tokens(), 150);  // three byte-tokenized documents
  EXPECT_EQ(u.prompt_tokens(), u.cached_tokens() + u.computed_tokens());
  ExpectIdle();
  server_->RefreshMetrics();
  EXPECT_EQ(Requests("ok"), 1);
  EXPECT_GT(MetricValue(*server_->registry(), "lazyattn_worker_prefill_tokens_total",
                        {{"kind", "computed"}}),
            150);
}

// The ids of the generated tokens (the final flush chunk, id -1, left out).
std::vector<int32_t> Ids(const StreamResult& r) {
  std::vector<int32_t> ids;
  for (const v1::TokenChunk& c : r.chunks) {
    if (c.token_id() >= 0) ids.push_back(c.token_id());
  }
  return ids;
}

TEST_F(WorkerServiceTest, UnseededRequestsDifferAndASeedRepeats) {
  StartServer();
  v1::GenerateRequest r = Request(kDocs, 24);
  r.mutable_sampling()->set_temperature(1.5f);  // near-uniform over 300 ids: a repeat is ~300^-24
  const StreamResult a = Generate(r), b = Generate(r);
  ASSERT_TRUE(a.status.ok() && b.status.ok()) << a.status.error_message();
  ASSERT_EQ(Ids(a).size(), 24u);
  EXPECT_NE(Ids(a), Ids(b)) << "two unseeded requests drew the same tokens";
  r.mutable_sampling()->set_seed(0);  // a set seed, even 0, is not "unseeded"
  const StreamResult c = Generate(r), d = Generate(r);
  ASSERT_TRUE(c.status.ok() && d.status.ok());
  EXPECT_EQ(Ids(c), Ids(d));
  EXPECT_NE(Ids(c), Ids(a));
  r.mutable_sampling()->set_seed(12345);
  const StreamResult e = Generate(r), f = Generate(r);
  ASSERT_TRUE(e.status.ok() && f.status.ok());
  EXPECT_EQ(Ids(e), Ids(f));
  EXPECT_NE(Ids(e), Ids(c));
  ExpectIdle();
}

TEST_F(WorkerServiceTest, LogprobsComeWithEachTokenOnlyWhenAsked) {
  StartServer();
  v1::GenerateRequest r = Request(kDocs, 12);
  const StreamResult plain = Generate(r);
  ASSERT_TRUE(plain.status.ok());
  for (const v1::TokenChunk& c : plain.chunks) EXPECT_FALSE(c.has_logprob());

  // Greedy: the chosen token is the most likely, so its probability is at least 1/vocab.
  r.mutable_sampling()->set_logprobs(true);
  const StreamResult greedy = Generate(r);
  ASSERT_TRUE(greedy.status.ok());
  EXPECT_EQ(Ids(greedy), Ids(plain));  // asking for logprobs changes no token
  int with = 0;
  for (const v1::TokenChunk& c : plain.chunks) EXPECT_TRUE(c.token_bytes().empty());
  for (const v1::TokenChunk& c : greedy.chunks) {
    EXPECT_EQ(c.has_logprob(), c.token_id() >= 0) << "chunk " << c.token_id();
    if (!c.has_logprob()) {
      EXPECT_TRUE(c.token_bytes().empty());
      continue;
    }
    ++with;
    // Each token's own bytes, as the tokenizer decodes it alone.
    EXPECT_EQ(c.token_bytes(), tokenizer_->TokenPiece(c.token_id())) << "chunk " << c.token_id();
    EXPECT_LE(c.logprob(), 0.0f);
    EXPECT_GE(c.logprob(), -std::log(300.0f) - 1e-4f);
  }
  EXPECT_EQ(with, 12);

  // Sampled and seeded: the same tokens and log-probabilities again, each a real probability.
  r.mutable_sampling()->set_temperature(1.0f);
  r.mutable_sampling()->set_seed(7);
  const StreamResult s1 = Generate(r), s2 = Generate(r);
  ASSERT_TRUE(s1.status.ok() && s2.status.ok());
  ASSERT_EQ(s1.chunks.size(), s2.chunks.size());
  bool below_greedy_bound = false;
  for (size_t i = 0; i < s1.chunks.size(); ++i) {
    if (s1.chunks[i].token_id() < 0) continue;
    ASSERT_TRUE(s1.chunks[i].has_logprob());
    EXPECT_EQ(s1.chunks[i].logprob(), s2.chunks[i].logprob());
    EXPECT_LT(s1.chunks[i].logprob(), 0.0f);
    EXPECT_GT(s1.chunks[i].logprob(), -60.0f);
    below_greedy_bound |= s1.chunks[i].logprob() < -std::log(300.0f);
  }
  // Temperature 1 over 300 near-uniform ids: some draw is less likely than 1/300.
  EXPECT_TRUE(below_greedy_bound);
  ExpectIdle();
}

// top_logprobs = k: each real token's chunk carries k alternatives with their own bytes, ranked;
// greedy, the chosen token heads them with exactly the chunk's logprob. Tokens do not change.
TEST_F(WorkerServiceTest, TopLogprobsComeRankedWithEachToken) {
  StartServer();
  v1::GenerateRequest r = Request(kDocs, 12);
  r.mutable_sampling()->set_logprobs(true);
  const StreamResult plain = Generate(r);
  ASSERT_TRUE(plain.status.ok());
  for (const v1::TokenChunk& c : plain.chunks) EXPECT_EQ(c.top_logprobs_size(), 0);

  r.mutable_sampling()->set_top_logprobs(3);
  const StreamResult top = Generate(r);
  ASSERT_TRUE(top.status.ok()) << top.status.error_message();
  EXPECT_EQ(Ids(top), Ids(plain));
  int with = 0;
  for (const v1::TokenChunk& c : top.chunks) {
    if (c.token_id() < 0) {
      EXPECT_EQ(c.top_logprobs_size(), 0);
      continue;
    }
    ++with;
    ASSERT_EQ(c.top_logprobs_size(), 3) << "chunk " << c.token_id();
    EXPECT_EQ(c.top_logprobs(0).token_id(), c.token_id());
    EXPECT_EQ(c.top_logprobs(0).logprob(), c.logprob());
    for (int i = 0; i < 3; ++i) {
      const v1::TopLogprob& e = c.top_logprobs(i);
      EXPECT_EQ(e.token_bytes(), tokenizer_->TokenPiece(e.token_id()));
      EXPECT_LE(e.logprob(), 0.0f);
      if (i > 0) {
        EXPECT_LE(e.logprob(), c.top_logprobs(i - 1).logprob());
        EXPECT_NE(e.token_id(), c.top_logprobs(i - 1).token_id());
      }
    }
  }
  EXPECT_EQ(with, 12);
  ExpectIdle();
}

// The preparing thread hands the request to the engine and then still updates the call's
// reactor; the engine may finish a short request and its call end in between. Here the thread
// is held at that point until the client has its whole answer: the reactor must outlive both.
// (It did not: a use-after-free that crashed about one worker test run in 150 under load.)
TEST_F(WorkerServiceTest, ACallThatEndsBeforeItsSubmitReturnsOutlivesIt) {
  // The hook may still run after a call's answer is in, so what it touches is shared with it
  // rather than on this test's stack, and the test waits for each hook before it moves on.
  struct HookState {
    absl::Notification answered;
    std::atomic<int> held{0};
  };
  auto state = std::make_shared<HookState>();
  after_submit_for_test_ = [state] {
    state->answered.WaitForNotificationWithTimeout(absl::Seconds(10));
    absl::SleepFor(absl::Milliseconds(50));  // let gRPC's OnDone run too
    ++state->held;
  };
  auto wait_for_hooks = [&](int n) {
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (state->held.load() < n && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
    return state->held.load();
  };
  StartServer();
  const StreamResult r = Generate(Request(kDocs, 1));
  const int held_before_answer = state->held.load();
  state->answered.Notify();
  EXPECT_EQ(held_before_answer, 0) << "the preparing thread was not held past the answer";
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(Ids(r).size(), 1u);
  EXPECT_EQ(wait_for_hooks(1), 1);
  ExpectIdle();
  // The thread let go of the reactor without a fault; the worker still serves.
  EXPECT_TRUE(Generate(Request(kDocs, 2)).status.ok());
  EXPECT_EQ(wait_for_hooks(2), 2);
}

// logit_bias steers a greedy generation: -100 on the first token's id makes the first token the
// runner-up the alternatives listed, and +100 on another id makes every token that id, with a
// log-probability of ~0 (that of the biased distribution). The worker advertises how many
// entries it applies.
TEST_F(WorkerServiceTest, LogitBiasBansAndForcesTokens) {
  StartServer();
  EXPECT_EQ(Status().model().max_logit_bias(), 300);
  v1::GenerateRequest r = Request(kDocs, 6);
  r.mutable_sampling()->set_logprobs(true);
  r.mutable_sampling()->set_top_logprobs(3);
  r.mutable_sampling()->set_ignore_eos(true);
  const StreamResult plain = Generate(r);
  ASSERT_TRUE(plain.status.ok()) << plain.status.error_message();
  ASSERT_FALSE(plain.chunks.empty());
  const v1::TokenChunk& first = plain.chunks[0];
  ASSERT_EQ(first.top_logprobs_size(), 3);
  const int32_t runner_up = first.top_logprobs(1).token_id();
  const int32_t third = first.top_logprobs(2).token_id();

  v1::GenerateRequest ban = r;
  (*ban.mutable_sampling()->mutable_logit_bias())[first.token_id()] = -100.0f;
  const StreamResult banned = Generate(ban);
  ASSERT_TRUE(banned.status.ok()) << banned.status.error_message();
  ASSERT_FALSE(banned.chunks.empty());
  EXPECT_EQ(banned.chunks[0].token_id(), runner_up);
  for (int32_t id : Ids(banned)) EXPECT_NE(id, first.token_id());

  v1::GenerateRequest force = r;
  (*force.mutable_sampling()->mutable_logit_bias())[third] = 100.0f;
  const StreamResult forced = Generate(force);
  ASSERT_TRUE(forced.status.ok()) << forced.status.error_message();
  EXPECT_EQ(Ids(forced), std::vector<int32_t>(6, third));
  for (const v1::TokenChunk& c : forced.chunks) {
    if (c.token_id() >= 0) {
      EXPECT_NEAR(c.logprob(), 0.0f, 1e-3f);
    }
  }
  ExpectIdle();
}

}  // namespace
}  // namespace lazyattn
