// A broken or hostile worker behind the router, over real gRPC with scripted fake workers: a
// Generate stream outside its grammar (worker_stream_check.h) is cut at the router, counted
// against the worker, and never reaches the client as an answer; a Complete call fails over to a
// sound worker. A message that does not parse ends the attempt too, and PrefillProgress events
// that report no progress keep no attempt alive.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "lazyattn/v1/inference.grpc.pb.h"
#include "services/router/server/router_server_test_fixture.h"
#include "services/router/server/worker_attempt.h"

namespace lazyattn::router {
namespace {

using lazyattn::v1::GenerateRequest;
using lazyattn::v1::GenerateResponse;
using testing::FakeWorker;
using ::testing::HasSubstr;
using testing::StreamResult;

// w0 holds "doc", so it is every request's first choice; w1 is sound. No breaker trips inside a
// test: each case starts from a closed one.
class WorkerProtocolTest : public testing::RouterServerTest {
 protected:
  void SetUp() override {
    StartWorkers(2);
    StartKvdir();
    kvdir_.Hold("w0", "doc", 500);
  }

  RouterOptions Options() {
    RouterOptions o = RouterServerTest::Options();
    o.routing.breaker.failure_threshold = 1000;
    return o;
  }

  static GenerateRequest Request(int max_tokens = 0) {
    GenerateRequest r = RouterServerTest::Request({"doc"});
    r.mutable_sampling()->set_max_tokens(max_tokens);
    return r;
  }

  grpc::Status Complete(const GenerateRequest& request, lazyattn::v1::CompleteResponse* response) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    return stub_->Complete(&ctx, request, response);
  }

  std::string ProtocolErrors() const {
    const std::string text = Metrics();
    const std::string key = "lazyattn_router_worker_protocol_errors_total{model=\"fake-model\"} ";
    const size_t at = text.find(key);
    if (at == std::string::npos) return "absent";
    return text.substr(at + key.size(), text.find('\n', at) - at - key.size());
  }
};

GenerateResponse TokenMessage(int id, const std::string& text) {
  GenerateResponse r;
  r.mutable_token()->set_token_id(id);
  r.mutable_token()->set_text(text);
  return r;
}

// One stream per kind of break: the client gets UNAVAILABLE naming it and never the offending
// message; each is counted once.
TEST_F(WorkerProtocolTest, AStreamOutsideTheGrammarIsCutBeforeTheOffendingMessage) {
  StartRouter(Options());
  struct Case {
    const char* what;
    FakeWorker::Script script;
    int max_tokens;
    std::vector<std::string> relayed;  // what reached the client before the cut
    const char* message;
  };
  const std::vector<Case> cases = {
      {"more tokens than max_tokens",
       {.tokens = {"a", "b", "c"}},
       2,
       {"a", "b"},
       "more than 2 tokens"},
      {"a token id past the vocabulary (1000)",
       {.tokens = {"a", "b"}, .first_token_id = 999},
       0,
       {"a"},
       "token.token_id 1000 outside the model's vocabulary [0, 1000)"},
      {"a token after the final message",
       {.tokens = {"a"}, .after_final = {TokenMessage(5, "smuggled")}},
       0,
       {"a"},
       "a message after the final one"},
  };
  int counted = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    workers_[0]->SetScript(c.script);
    StreamResult r = Stream(Request(c.max_tokens));
    EXPECT_EQ(r.status.error_code(), grpc::StatusCode::UNAVAILABLE);
    EXPECT_THAT(
        r.status.error_message(),
        HasSubstr(absl::StrCat("the worker broke the Generate stream's protocol: ", c.message)));
    // Streamed output cannot be taken back, so no other worker is tried.
    EXPECT_THAT(r.status.error_message(), HasSubstr("not retried on another worker"));
    EXPECT_EQ(r.tokens, c.relayed);
    EXPECT_FALSE(r.final.has_value());
    EXPECT_EQ(workers_[1]->generate_calls(), 0);
    EXPECT_EQ(ProtocolErrors(), absl::StrCat(++counted));
  }
}

// Alternatives outside what was asked for (worker_stream_check.h) cut the stream the same way,
// before the offending chunk: other than the request's top_logprobs (the fake worker advertises
// them), and some on a request that asked for none.
TEST_F(WorkerProtocolTest, AlternativesBeyondTheRequestCutTheStream) {
  StartRouter(Options());
  FakeWorker::Script script;
  script.tokens = {"a", "b"};
  script.edit_token = [](int i, lazyattn::v1::TokenChunk* chunk) {
    if (i != 1) return;
    lazyattn::v1::TopLogprob* extra = chunk->add_top_logprobs();
    extra->set_token_id(7);
    extra->set_logprob(-9999.0f);
  };
  workers_[0]->SetScript(script);
  GenerateRequest request = Request();
  request.mutable_sampling()->set_logprobs(true);
  request.mutable_sampling()->set_top_logprobs(2);
  StreamResult r = Stream(request);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(r.status.error_message(),
              HasSubstr("token.top_logprobs: 3 entries, the request's 2 expected"));
  ASSERT_EQ(r.chunks.size(), 1u);
  EXPECT_EQ(r.chunks[0].top_logprobs_size(), 2);
  EXPECT_EQ(ProtocolErrors(), "1");

  r = Stream(Request());  // no logprobs asked for: the one extra entry is already too many
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(r.status.error_message(),
              HasSubstr("token.top_logprobs: 1 entries, but the request asked for none"));
  EXPECT_EQ(r.tokens, (std::vector<std::string>{"a"}));
  EXPECT_EQ(ProtocolErrors(), "2");
}

// A unary call has sent nothing when the break comes: it fails over to the sound worker and
// returns its answer, nothing of the broken one's.
TEST_F(WorkerProtocolTest, CompleteFailsOverFromABrokenStream) {
  StartRouter(Options());
  workers_[0]->SetScript({.tokens = {"bad", "worse", "worst"}});
  workers_[1]->SetScript({.tokens = {"good"}});
  lazyattn::v1::CompleteResponse response;
  grpc::Status s = Complete(Request(/*max_tokens=*/2), &response);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(response.text(), "good");
  EXPECT_EQ(response.final().worker(), "w1");
  EXPECT_EQ(response.final().attempts(), 2);
  EXPECT_EQ(ProtocolErrors(), "1");

  // Both broken: the status names the break on each.
  workers_[1]->SetScript({.tokens = {"a"}, .first_token_id = -7});
  response.Clear();
  s = Complete(Request(2), &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(s.error_message(), HasSubstr("w0 ("));
  EXPECT_THAT(s.error_message(), HasSubstr("more than 2 tokens"));
  EXPECT_THAT(s.error_message(), HasSubstr("w1 ("));
  EXPECT_THAT(s.error_message(), HasSubstr("token.token_id -7 is negative"));
  EXPECT_EQ(ProtocolErrors(), "3");
}

// Sound streams at the edges of the grammar pass untouched: exactly max_tokens tokens and the
// held-back text after them.
TEST_F(WorkerProtocolTest, AStreamAtItsLimitsPasses) {
  StartRouter(Options());
  workers_[0]->SetScript({.tokens = {"a", "b"}, .held_back_tail = "c", .first_token_id = 998});
  StreamResult r = Stream(Request(/*max_tokens=*/2));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.tokens, (std::vector<std::string>{"a", "b", "c"}));
  ASSERT_TRUE(r.final.has_value());
  EXPECT_EQ(r.final->worker(), "w0");
  EXPECT_EQ(ProtocolErrors(), "0");
}

// A message that does not parse (a string field that is not UTF-8) fails the router's read as
// the stream's end does; a worker that then holds its call open is cut kEndGrace later instead
// of holding the request until the client's deadline (which may be none): a stream ends
// UNAVAILABLE naming it, a Complete call fails over.
TEST_F(WorkerProtocolTest, AMessageThatDoesNotParseEndsTheAttemptWithinTheGrace) {
  StartRouter(Options());
  workers_[0]->SetScript({.tokens = {"a", "b", "c"}, .unparsable_after_tokens = 1});
  absl::Time start = absl::Now();
  StreamResult r = Stream(Request());
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(r.status.error_message(),
              HasSubstr("a message that does not parse as a GenerateResponse"));
  EXPECT_EQ(r.tokens, (std::vector<std::string>{"a"}));
  EXPECT_GE(absl::Now() - start, WorkerAttempt::kEndGrace);
  EXPECT_LT(absl::Now() - start, absl::Seconds(20));  // not the client's 30 s deadline
  EXPECT_TRUE(workers_[0]->WaitForCancellation(absl::Seconds(10)));
  EXPECT_EQ(ProtocolErrors(), "1");

  workers_[1]->SetScript({.tokens = {"good"}});
  lazyattn::v1::CompleteResponse response;
  start = absl::Now();
  grpc::Status s = Complete(Request(), &response);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(response.text(), "good");
  EXPECT_EQ(response.final().attempts(), 2);
  EXPECT_LT(absl::Now() - start, absl::Seconds(20));
  EXPECT_EQ(ProtocolErrors(), "2");
}

// The answer is the tokens' text whatever the worker's final message claims: a stream's final
// message and a Complete call carry what the tokens said (here 1 MB of claimed text for 2
// tokens), so streamed and unary answers agree and stay bounded by max_tokens.
TEST_F(WorkerProtocolTest, TheAnswerIsTheTokensTextNotTheFinalMessagesClaim) {
  StartRouter(Options());
  workers_[0]->SetScript({.tokens = {"a", "b"}, .final_text = std::string(1 << 20, 'z')});
  StreamResult r = Stream(Request(2));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  ASSERT_TRUE(r.final.has_value());
  EXPECT_EQ(r.final->text(), "ab");
  lazyattn::v1::CompleteResponse response;
  grpc::Status s = Complete(Request(2), &response);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(response.text(), "ab");
  EXPECT_EQ(response.final().text(), "ab");
  EXPECT_EQ(ProtocolErrors(), "0");
}

// PrefillProgress events re-arm the first-token timeout only while the count they report grows:
// a worker whose events keep coming with the same count (its engine wedged) is cut at the
// timeout, and the request fails over.
TEST_F(WorkerProtocolTest, ProgressEventsThatReportNoProgressKeepNothingAlive) {
  RouterOptions o = Options();
  o.routing.first_token_timeout = absl::Milliseconds(400);
  StartRouter(o);
  workers_[0]->SetScript({.prefill = absl::Seconds(30),
                          .prefill_progress_every = absl::Milliseconds(50),
                          .progress_stuck = true});
  const absl::Time start = absl::Now();
  StreamResult r = Stream(Request());
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.final->worker(), "w1");
  EXPECT_EQ(r.final->attempts(), 2);
  // One growing event (the first) may re-arm it once: cut within two timeouts, far from 30 s.
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_GE(workers_[0]->progress_events(), 3);
  EXPECT_THAT(Metrics(),
              HasSubstr("lazyattn_router_first_token_timeouts_total{model=\"fake-model\"} 1"));
  EXPECT_EQ(ProtocolErrors(), "0");  // a timeout, not a break of the grammar
}

// A request waiting in a busy worker's queue, whose engine works through the requests ahead of it
// (`queued` events, no prefill count), is not cut: moved, it would start over in another queue
// and lose the wait. Served by the first worker, in one attempt, long after the timeout.
TEST_F(WorkerProtocolTest, QueuedEventsKeepARequestWaitingInABusyWorkersQueue) {
  RouterOptions o = Options();
  o.routing.first_token_timeout = absl::Milliseconds(300);
  StartRouter(o);
  workers_[0]->SetScript({.prefill = absl::Seconds(1.5),
                          .prefill_progress_every = absl::Milliseconds(50),
                          .progress_queued = true});
  StreamResult r = Stream(Request());
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.final->worker(), "w0");
  EXPECT_EQ(r.final->attempts(), 1);
  EXPECT_GE(workers_[0]->progress_events(), 10);
  EXPECT_THAT(Metrics(),
              Not(HasSubstr("lazyattn_router_first_token_timeouts_total{model=\"fake-model\"} 1")));
  EXPECT_EQ(ProtocolErrors(), "0");
}

// The first-token timeout's restarts are bounded: a worker that reports its request queued for
// ever (a starved queue, a broken or hostile worker) is cut routing.first_token_max_wait after
// the attempt's start, counted as a first-token timeout, and the request goes to the next worker;
// when every worker does it, the request ends UNAVAILABLE naming the bound, long before its
// client's deadline.
TEST_F(WorkerProtocolTest, QueuedEventsHoldAnAttemptNoLongerThanTheMaxWait) {
  RouterOptions o = Options();
  o.routing.first_token_timeout = absl::Milliseconds(300);
  o.routing.first_token_max_wait = absl::Milliseconds(1200);
  StartRouter(o);
  const FakeWorker::Script queued_forever = {.prefill = absl::Seconds(60),
                                             .prefill_progress_every = absl::Milliseconds(50),
                                             .progress_queued = true};
  workers_[0]->SetScript(queued_forever);
  absl::Time start = absl::Now();
  StreamResult r = Stream(Request());
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.final->worker(), "w1");
  EXPECT_EQ(r.final->attempts(), 2);
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(1200));  // the events kept w0 alive till then
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_GE(workers_[0]->progress_events(), 10);
  EXPECT_TRUE(workers_[0]->WaitForCancellation(absl::Seconds(10)));
  EXPECT_THAT(Metrics(),
              HasSubstr("lazyattn_router_first_token_timeouts_total{model=\"fake-model\"} 1"));

  workers_[1]->SetScript(queued_forever);
  start = absl::Now();
  r = Stream(Request());
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(r.status.error_message(), HasSubstr("routing.first_token_max_wait_ms"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(20));  // not the client's 30 s deadline
  EXPECT_EQ(ProtocolErrors(), "0");
}

// With the first-token timeout off, the bound still holds on its own: a worker that takes the
// call and then says nothing (frozen) is cut at routing.first_token_max_wait, not at the client's
// deadline.
TEST_F(WorkerProtocolTest, TheMaxWaitHoldsWithTheFirstTokenTimeoutOff) {
  RouterOptions o = Options();
  o.routing.first_token_timeout = absl::ZeroDuration();
  o.routing.first_token_max_wait = absl::Milliseconds(800);
  StartRouter(o);
  workers_[0]->SetScript({.block = true});
  const absl::Time start = absl::Now();
  StreamResult r = Stream(Request());
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.final->worker(), "w1");
  EXPECT_EQ(r.final->attempts(), 2);
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(800));
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_TRUE(workers_[0]->WaitForCancellation(absl::Seconds(10)));
  workers_[0]->Unblock();
}

// Failed attempts are counted by worker and code, so one worker refusing what the others serve
// stands out (INVALID_ARGUMENT touches no breaker: a client's bad requests would eject every
// worker). A drain's hand-back is a move, not a failure, and is not counted.
TEST_F(WorkerProtocolTest, FailedAttemptsAreCountedByWorkerAndCode) {
  StartRouter(Options());
  workers_[0]->SetScript({.fail_before_first_token = grpc::StatusCode::INVALID_ARGUMENT});
  StreamResult r = Stream(Request());
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(Metrics(),
              HasSubstr("lazyattn_router_worker_failures_total{code=\"invalid_argument\","
                        "model=\"fake-model\",worker=\"w0\"} 1"));

  workers_[0]->SetScript(
      {.fail_before_first_token = grpc::StatusCode::UNAVAILABLE, .handed_back = true});
  r = Stream(Request());
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.final->worker(), "w1");
  const std::string m = Metrics();
  EXPECT_THAT(m, Not(HasSubstr("lazyattn_router_worker_failures_total{code=\"unavailable\"")));
  EXPECT_THAT(m, HasSubstr("lazyattn_router_worker_failures_total{code=\"invalid_argument\","
                           "model=\"fake-model\",worker=\"w0\"} 1"));
}

// A worker that sends its final message and then never ends the call: the answer is complete,
// so the router cuts the call kEndGrace later and ends the request OK with that final (stream
// and Complete alike, no other worker asked, even with no between-tokens timeout at all); the
// lapse is counted as a protocol error.
TEST_F(WorkerProtocolTest, AFinalMessageThenACallHeldOpenEndsOkAfterTheGrace) {
  RouterOptions o = Options();
  o.routing.token_idle_timeout = absl::ZeroDuration();
  StartRouter(o);
  workers_[0]->SetScript({.tokens = {"a", "b", "c"}, .block_after_final = true});
  const absl::Time start = absl::Now();
  StreamResult r = Stream(Request());
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.tokens, (std::vector<std::string>{"a", "b", "c"}));
  ASSERT_TRUE(r.final.has_value());
  EXPECT_EQ(r.final->worker(), "w0");
  EXPECT_EQ(r.final->attempts(), 1);
  EXPECT_GE(absl::Now() - start, WorkerAttempt::kEndGrace);
  EXPECT_TRUE(workers_[0]->WaitForCancellation(absl::Seconds(10)));
  EXPECT_EQ(ProtocolErrors(), "1");

  lazyattn::v1::CompleteResponse response;
  const grpc::Status s = Complete(Request(), &response);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(response.text(), "abc");
  EXPECT_EQ(response.final().worker(), "w0");
  EXPECT_EQ(workers_[1]->generate_calls(), 0);
  EXPECT_EQ(ProtocolErrors(), "2");
}

}  // namespace
}  // namespace lazyattn::router
