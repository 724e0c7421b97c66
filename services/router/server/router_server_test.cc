// The router over real gRPC on 127.0.0.1 (ports chosen by the OS), with scripted fake workers and
// a fake KV directory. Timing never decides an outcome: directory lookups get generous deadlines
// except in the test about a hanging directory, worker lists are refreshed explicitly, and
// blocking fakes are released by the test.
#include "services/router/server/router_server.h"

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <prometheus/text_serializer.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "lazyattn/v1/inference.grpc.pb.h"
#include "services/router/server/fake_cluster_for_test.h"

namespace lazyattn::router {
namespace {

using lazyattn::v1::GenerateRequest;
using lazyattn::v1::GenerateResponse;
using ::testing::ElementsAre;
using testing::FakeKvdir;
using testing::RouterOptionsForFakeKvdir;
using testing::FakeWorker;
using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

struct StreamResult {
  std::vector<std::string> tokens;
  std::optional<lazyattn::v1::Final> final;
  grpc::Status status;
  int other_events = 0;  // neither a token nor the final: never meant for a client
};

class RouterServerTest : public ::testing::Test {
 protected:
  void StartWorkers(int n) {
    for (int i = 0; i < n; ++i) {
      workers_.push_back(std::make_unique<FakeWorker>(absl::StrCat("w", i)));
      workers_.back()->Start();
    }
  }

  void StartKvdir() {
    kvdir_.Start();
    std::vector<lazyattn::v1::WorkerStatus> statuses;
    for (const auto& w : workers_) statuses.push_back(w->Status());
    kvdir_.SetWorkers(statuses);
  }

  RouterOptions Options() {
    RouterOptions o = RouterOptionsForFakeKvdir(kvdir_.address());
    return o;
  }

  void StartRouter(const RouterOptions& options) {
    registry_ = std::make_shared<prometheus::Registry>();
    auto server = RouterServer::Create(options, registry_);
    ASSERT_TRUE(server.ok()) << server.status();
    router_ = std::move(*server);
    stub_ = lazyattn::v1::Inference::NewStub(grpc::CreateChannel(
        absl::StrCat("127.0.0.1:", router_->port()), grpc::InsecureChannelCredentials()));
  }

  static GenerateRequest Request(const std::vector<std::string>& docs,
                                 const std::string& question = "What is it?") {
    GenerateRequest r;
    for (const auto& d : docs) r.add_documents()->set_text(d);
    r.set_question(question);
    return r;
  }

  StreamResult Stream(const GenerateRequest& request, absl::Duration deadline = absl::Seconds(30)) {
    StreamResult result;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
    auto reader = stub_->Generate(&ctx, request);
    GenerateResponse r;
    while (reader->Read(&r)) {
      if (r.has_token()) result.tokens.push_back(r.token().text());
      if (r.has_final()) result.final = r.final();
      if (!r.has_token() && !r.has_final()) ++result.other_events;
    }
    result.status = reader->Finish();
    return result;
  }

  std::string Metrics() const {
    return prometheus::TextSerializer().Serialize(registry_->Collect());
  }

  std::vector<std::unique_ptr<FakeWorker>> workers_;
  FakeKvdir kvdir_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<RouterServer> router_;  // destroyed before the fakes
  std::unique_ptr<lazyattn::v1::Inference::Stub> stub_;
};

TEST_F(RouterServerTest, StreamsFromTheWorkerHoldingTheDocumentsInAnyOrder) {
  StartWorkers(3);
  StartKvdir();
  kvdir_.Hold("w2", "doc alpha", 300);
  kvdir_.Hold("w2", "doc beta", 200);
  kvdir_.Hold("w0", "doc gamma", 100);
  StartRouter(Options());

  for (const auto& docs : std::vector<std::vector<std::string>>{
           {"doc alpha", "doc beta"}, {"doc beta", "doc gamma", "doc alpha"}}) {
    StreamResult r = Stream(Request(docs));
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_THAT(r.tokens, ElementsAre("Hello", ",", " world"));
    ASSERT_TRUE(r.final.has_value());
    EXPECT_EQ(r.final->worker(), "w2");
    EXPECT_EQ(r.final->attempts(), 1);
    EXPECT_EQ(r.final->text(), "Hello, world");
    EXPECT_EQ(r.final->usage().documents(), static_cast<int64_t>(docs.size()));
  }
  EXPECT_EQ(workers_[2]->generate_calls(), 2);
  EXPECT_EQ(workers_[2]->last_request().documents_size(), 3);
  EXPECT_EQ(kvdir_.lookups(), 2);

  const std::string metrics = Metrics();
  EXPECT_THAT(metrics, HasSubstr("lazyattn_router_requests_total{model=\"fake-model\",policy="
                                 "\"cache_aware\",status=\"ok\"} 2"));
  EXPECT_THAT(
      metrics,
      HasSubstr("lazyattn_router_worker_selections_total{model=\"fake-model\",worker=\"w2\"} 2"));
  EXPECT_THAT(metrics,
              HasSubstr("lazyattn_router_predicted_hit_tokens_total{model=\"fake-model\"} 1000"));
  EXPECT_THAT(metrics, HasSubstr("lazyattn_router_routing_duration_seconds_count 2"));
}

TEST_F(RouterServerTest, CompleteReturnsTheWholeText) {
  StartWorkers(1);
  StartKvdir();
  StartRouter(Options());
  grpc::ClientContext ctx;
  lazyattn::v1::CompleteResponse response;
  grpc::Status s = stub_->Complete(&ctx, Request({"some doc"}), &response);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(response.text(), "Hello, world");
  EXPECT_THAT(response.token_ids(), ElementsAre(100, 101, 102));
  EXPECT_EQ(response.final().worker(), "w0");
  EXPECT_EQ(response.final().attempts(), 1);
}

TEST_F(RouterServerTest, FailsOverWhenAWorkerFailsBeforeItsFirstToken) {
  StartWorkers(2);
  StartKvdir();
  kvdir_.Hold("w0", "doc", 500);  // w0 is the first choice
  workers_[0]->SetScript({.fail_before_first_token = grpc::StatusCode::UNAVAILABLE});
  StartRouter(Options());

  StreamResult r = Stream(Request({"doc"}));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  ASSERT_TRUE(r.final.has_value());
  EXPECT_EQ(r.final->worker(), "w1");
  EXPECT_EQ(r.final->attempts(), 2);
  EXPECT_THAT(r.tokens, ElementsAre("Hello", ",", " world"));
  EXPECT_EQ(workers_[0]->generate_calls(), 1);
  EXPECT_THAT(Metrics(), HasSubstr("lazyattn_router_retries_total{model=\"fake-model\"} 1"));
}

TEST_F(RouterServerTest, FailsOverFromAWorkerThatIsGone) {
  StartWorkers(2);
  StartKvdir();
  kvdir_.Hold("w0", "doc", 500);
  StartRouter(Options());
  workers_[0]->Stop();  // the directory still lists it (its lease has not expired yet)

  StreamResult r = Stream(Request({"doc"}));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.final->worker(), "w1");
  EXPECT_EQ(r.final->attempts(), 2);
}

TEST_F(RouterServerTest, AllWorkersFailingBeforeTokensNamesEachAttempt) {
  StartWorkers(2);
  StartKvdir();
  for (auto& w : workers_) w->SetScript({.fail_before_first_token = grpc::StatusCode::UNAVAILABLE});
  StartRouter(Options());
  StreamResult r = Stream(Request({"doc"}));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(r.status.error_message(), HasSubstr("2 attempts"));
  EXPECT_THAT(r.status.error_message(), HasSubstr("w0 ("));
  EXPECT_THAT(r.status.error_message(), HasSubstr("w1 ("));
}

TEST_F(RouterServerTest, FailureAfterTokensEndsTheStreamWithUnavailable) {
  StartWorkers(2);
  StartKvdir();
  kvdir_.Hold("w0", "doc", 500);
  workers_[0]->SetScript({.tokens = {"a", "b", "c", "d"}, .fail_after_tokens = 2});
  StartRouter(Options());

  StreamResult r = Stream(Request({"doc"}));
  EXPECT_THAT(r.tokens, ElementsAre("a", "b"));
  EXPECT_FALSE(r.final.has_value());
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(r.status.error_message(), HasSubstr("w0"));
  EXPECT_THAT(r.status.error_message(), HasSubstr("after 2 tokens"));
  EXPECT_THAT(r.status.error_message(), HasSubstr("not retried"));
  EXPECT_EQ(workers_[1]->generate_calls(), 0);
  EXPECT_THAT(Metrics(), HasSubstr("lazyattn_router_requests_total{model=\"fake-model\",policy="
                                   "\"cache_aware\",status=\"unavailable\"} 1"));
}

TEST_F(RouterServerTest, CompleteFailsOverEvenAfterTokensSinceNothingWasSent) {
  StartWorkers(2);
  StartKvdir();
  kvdir_.Hold("w0", "doc", 500);
  workers_[0]->SetScript({.tokens = {"a", "b", "c"}, .fail_after_tokens = 2});
  StartRouter(Options());
  grpc::ClientContext ctx;
  lazyattn::v1::CompleteResponse response;
  grpc::Status s = stub_->Complete(&ctx, Request({"doc"}), &response);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(response.text(), "Hello, world");
  EXPECT_EQ(response.token_ids_size(), 3);
  EXPECT_EQ(response.final().worker(), "w1");
  EXPECT_EQ(response.final().attempts(), 2);
}

TEST_F(RouterServerTest, ServesWhenTheDirectoryIsDown) {
  StartWorkers(2);
  StartKvdir();
  kvdir_.Hold("w1", "doc", 500);
  StartRouter(Options());
  kvdir_.Stop();  // the router keeps the last list it had

  std::vector<std::string> served;
  for (int i = 0; i < 4; ++i) {
    StreamResult r = Stream(Request({"doc"}, absl::StrCat("question ", i)));
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    served.push_back(r.final->worker());
  }
  EXPECT_EQ(served.size(), 4u);
  EXPECT_EQ(workers_[0]->generate_calls() + workers_[1]->generate_calls(), 4);
}

TEST_F(RouterServerTest, AHangingDirectoryCostsOnlyTheLookupTimeout) {
  StartWorkers(2);
  StartKvdir();
  RouterOptions o = Options();
  o.kvdir.lookup_timeout = absl::Milliseconds(50);
  StartRouter(o);
  kvdir_.SetHang(true);
  StreamResult r = Stream(Request({"doc"}), absl::Seconds(30));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(kvdir_.lookups(), 1);
}

TEST_F(RouterServerTest, StaticWorkersWithoutADirectory) {
  StartWorkers(2);
  RouterOptions o = Options();
  o.kvdir.address.clear();
  o.workers = {workers_[0]->address(), workers_[1]->address()};
  o.routing.policy.kind = PolicyKind::kRoundRobin;
  StartRouter(o);

  std::vector<std::string> served;
  for (int i = 0; i < 4; ++i) {
    StreamResult r = Stream(Request({"doc"}));
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    served.push_back(r.final->worker());
  }
  EXPECT_THAT(served, ElementsAre("w0", "w1", "w0", "w1"));

  grpc::ClientContext ctx;
  lazyattn::v1::ModelInfo info;
  ASSERT_TRUE(stub_->GetModelInfo(&ctx, {}, &info).ok());
  EXPECT_EQ(info.workers(), 2);
  EXPECT_EQ(info.model_fingerprint(), testing::kModelFp);
  EXPECT_EQ(info.max_documents(), 32);  // the worker's limit is below the router's 64
}

TEST_F(RouterServerTest, ABurstForNewDocumentsStaysOnOneWorker) {
  StartWorkers(3);
  StartKvdir();  // nobody holds the documents: only the speculative entries steer
  RouterOptions o = Options();
  o.routing.speculative.ttl = absl::Hours(1);  // the burst's pace must not matter
  StartRouter(o);
  std::vector<std::string> served;
  for (int i = 0; i < 5; ++i) {
    StreamResult r = Stream(i % 2 ? Request({"new b", "new a"}) : Request({"new a", "new b"}));
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    served.push_back(r.final->worker());
  }
  for (const auto& w : served) EXPECT_EQ(w, served[0]);
}

TEST_F(RouterServerTest, CircuitBreakerStopsSendingToAFailingWorker) {
  StartWorkers(2);
  StartKvdir();
  kvdir_.Hold("w0", "doc", 500);  // w0 would always be first
  workers_[0]->SetScript({.fail_before_first_token = grpc::StatusCode::UNAVAILABLE});
  RouterOptions o = Options();
  o.routing.breaker = {.failure_threshold = 2, .open_duration = absl::Hours(1)};
  StartRouter(o);
  for (int i = 0; i < 5; ++i) {
    StreamResult r = Stream(Request({"doc"}));
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_EQ(r.final->worker(), "w1");
    EXPECT_EQ(r.final->attempts(), i < 2 ? 2 : 1) << "request " << i;
  }
  EXPECT_EQ(workers_[0]->generate_calls(), 2);
}

TEST_F(RouterServerTest, InternalErrorsCountAgainstTheBreaker) {
  // A worker whose device is broken fails every request at once with INTERNAL: not retried (it may
  // be the request), but counted, so the breaker takes the worker out.
  StartWorkers(2);
  StartKvdir();
  kvdir_.Hold("w0", "doc", 500);
  workers_[0]->SetScript({.fail_before_first_token = grpc::StatusCode::INTERNAL});
  RouterOptions o = Options();
  o.routing.breaker = {.failure_threshold = 2, .open_duration = absl::Hours(1)};
  StartRouter(o);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(Stream(Request({"doc"})).status.error_code(), grpc::StatusCode::INTERNAL) << i;
  }
  StreamResult r = Stream(Request({"doc"}));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.final->worker(), "w1");
  EXPECT_EQ(workers_[0]->generate_calls(), 2);
}

TEST_F(RouterServerTest, FirstTokenTimeoutFailsOverFromAFrozenWorker) {
  StartWorkers(2);
  StartKvdir();
  kvdir_.Hold("w0", "doc", 500);  // w0 is the first choice, and never sends a token
  workers_[0]->SetScript({.block = true});
  RouterOptions o = Options();
  o.routing.first_token_timeout = absl::Milliseconds(300);
  StartRouter(o);
  const absl::Time start = absl::Now();
  StreamResult r = Stream(Request({"doc"}));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.final->worker(), "w1");
  EXPECT_EQ(r.final->attempts(), 2);
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(300));
  EXPECT_TRUE(workers_[0]->WaitForCancellation(absl::Seconds(30)));
  EXPECT_THAT(Metrics(),
              HasSubstr("lazyattn_router_first_token_timeouts_total{model=\"fake-model\"} 1"));

  // Every worker frozen: the final status says why each attempt was given up.
  workers_[1]->SetScript({.block = true});
  r = Stream(Request({"doc"}));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(r.status.error_message(),
              HasSubstr("no first token within 300 ms (routing.first_token_timeout_ms)"));
  workers_[0]->Unblock();
  workers_[1]->Unblock();
}

// A worker that froze after its first token (SIGSTOP mid-generation) holds no request past the
// between-tokens timeout: a stream ends UNAVAILABLE naming routing.token_idle_timeout_ms (its
// token was sent, so no other worker), a Complete call is retried on the next worker without the
// frozen one's partial text. A worker whose tokens keep coming, each within the timeout, is not
// cut however long its stream lasts.
TEST_F(RouterServerTest, TokenIdleTimeoutCutsAWorkerFrozenMidGeneration) {
  StartWorkers(2);
  StartKvdir();
  kvdir_.Hold("w0", "doc", 500);  // w0 is the first choice
  workers_[0]->SetScript({.block_after_tokens = 1});
  RouterOptions o = Options();
  o.routing.token_idle_timeout = absl::Milliseconds(300);
  StartRouter(o);
  const absl::Time start = absl::Now();
  StreamResult r = Stream(Request({"doc"}));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(r.status.error_message(), HasSubstr("no token for 300 ms after the previous token "
                                                  "(routing.token_idle_timeout_ms)"));
  EXPECT_EQ(r.tokens, (std::vector<std::string>{"Hello"}));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(300));
  EXPECT_TRUE(workers_[0]->WaitForCancellation(absl::Seconds(10)));
  EXPECT_EQ(workers_[1]->generate_calls(), 0);
  EXPECT_THAT(Metrics(),
              HasSubstr("lazyattn_router_token_idle_timeouts_total{model=\"fake-model\"} 1"));

  {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    lazyattn::v1::CompleteResponse response;
    grpc::Status s = stub_->Complete(&ctx, Request({"doc"}), &response);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(response.text(), "Hello, world");
    EXPECT_EQ(response.final().worker(), "w1");
    EXPECT_EQ(response.final().attempts(), 2);
  }
  EXPECT_THAT(Metrics(),
              HasSubstr("lazyattn_router_token_idle_timeouts_total{model=\"fake-model\"} 2"));
  EXPECT_THAT(Metrics(),
              HasSubstr("lazyattn_router_first_token_timeouts_total{model=\"fake-model\"} 0"));

  // Five tokens 150 ms apart: 600 ms in all, twice the timeout, each gap within it.
  for (auto& w : workers_) {
    w->SetScript({.tokens = {"a", "b", "c", "d", "e"}, .token_interval = absl::Milliseconds(150)});
  }
  workers_[0]->Unblock();
  r = Stream(Request({"doc"}));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.tokens, (std::vector<std::string>{"a", "b", "c", "d", "e"}));
  EXPECT_EQ(r.final->attempts(), 1);
  EXPECT_THAT(Metrics(),
              HasSubstr("lazyattn_router_token_idle_timeouts_total{model=\"fake-model\"} 2"));
}

// A long prefill that shows signs of life (PrefillProgress events, which the router asks for)
// outlasts the first-token timeout on the worker it started on: one attempt, no timeout counted,
// and nothing of the events reaches the client. Without them the same prefill is cut.
TEST_F(RouterServerTest, PrefillProgressKeepsALongPrefillFromTheFirstTokenTimeout) {
  StartWorkers(2);
  StartKvdir();
  kvdir_.Hold("w0", "doc", 500);  // w0 is the first choice
  workers_[0]->SetScript({.prefill = absl::Seconds(1.2)});
  RouterOptions o = Options();
  o.routing.first_token_timeout = absl::Milliseconds(300);
  StartRouter(o);
  StreamResult r = Stream(Request({"doc"}));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.final->worker(), "w0");
  EXPECT_EQ(r.final->attempts(), 1);
  EXPECT_EQ(r.tokens, (std::vector<std::string>{"Hello", ",", " world"}));
  EXPECT_EQ(r.other_events, 0);
  EXPECT_GE(workers_[0]->progress_events(), 5);
  EXPECT_THAT(Metrics(),
              ::testing::Not(
                  HasSubstr("lazyattn_router_first_token_timeouts_total{model=\"fake-model\"} 1")));

  // Progress that stops (a worker that froze mid-prefill) still times out, 300 ms after the last.
  const int events_before = workers_[0]->progress_events();
  workers_[0]->SetScript(
      {.prefill = absl::Seconds(30), .prefill_progress_for = absl::Milliseconds(600)});
  const absl::Time start = absl::Now();
  r = Stream(Request({"doc"}));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.final->worker(), "w1");
  EXPECT_EQ(r.final->attempts(), 2);
  // The last event came within one 50 ms interval of 600 ms; without the events the cut would
  // have come at 300 ms.
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(600 - 50 + 300));
  EXPECT_GE(workers_[0]->progress_events() - events_before, 5);
  EXPECT_TRUE(workers_[0]->WaitForCancellation(absl::Seconds(10)));
  EXPECT_THAT(Metrics(),
              HasSubstr("lazyattn_router_first_token_timeouts_total{model=\"fake-model\"} 1"));

  // Events after the first token (a worker breaking the protocol) reach no client either.
  workers_[1]->SetScript({.progress_between_tokens = true});
  kvdir_.Hold("w1", "doc2", 500);
  const int w1_events_before = workers_[1]->progress_events();
  r = Stream(Request({"doc2"}));
  EXPECT_EQ(workers_[1]->progress_events() - w1_events_before, 3);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.final->worker(), "w1");
  EXPECT_EQ(r.tokens, (std::vector<std::string>{"Hello", ",", " world"}));
  EXPECT_EQ(r.other_events, 0);
}

TEST_F(RouterServerTest, HealthProbesEjectAWorkerThatStoppedAnswering) {
  StartWorkers(2);
  StartKvdir();
  kvdir_.Hold("w0", "doc", 500);  // w0 would be first
  RouterOptions o = Options();
  o.health.interval = absl::Milliseconds(50);
  o.health.timeout = absl::Milliseconds(200);
  o.health.outliers = {.consecutive_failures = 2,
                       .base_ejection = absl::Hours(1),
                       .max_ejection = absl::Hours(1)};
  StartRouter(o);
  workers_[0]->Stop();  // the directory still lists it
  const absl::Time give_up = absl::Now() + absl::Seconds(20);
  while (absl::Now() < give_up &&
         Metrics().find("lazyattn_router_worker_ejections_total 1") == std::string::npos) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_THAT(Metrics(), HasSubstr("lazyattn_router_worker_ejections_total 1"));
  // No request is sent to it any more: the first attempt goes to w1.
  StreamResult r = Stream(Request({"doc"}));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.final->worker(), "w1");
  EXPECT_EQ(r.final->attempts(), 1);
}

TEST_F(RouterServerTest, TooManyInFlightIsResourceExhausted) {
  StartWorkers(1);
  StartKvdir();
  workers_[0]->SetScript({.block = true});
  RouterOptions o = Options();
  o.max_inflight_requests = 1;
  StartRouter(o);

  grpc::ClientContext first_ctx;
  auto first = stub_->Generate(&first_ctx, Request({"doc"}));
  ASSERT_TRUE(workers_[0]->WaitForCalls(1, absl::Seconds(30)));

  StreamResult second = Stream(Request({"doc"}));
  EXPECT_EQ(second.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(second.status.error_message(), HasSubstr("max_inflight_requests"));

  workers_[0]->Unblock();
  GenerateResponse r;
  int tokens = 0;
  while (first->Read(&r)) tokens += r.has_token();
  EXPECT_TRUE(first->Finish().ok());
  EXPECT_EQ(tokens, 3);
}

TEST_F(RouterServerTest, ClientDeadlineReachesTheWorker) {
  StartWorkers(1);
  StartKvdir();
  workers_[0]->SetScript({.block = true});
  StartRouter(Options());
  StreamResult r = Stream(Request({"doc"}), absl::Milliseconds(300));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_TRUE(workers_[0]->WaitForCancellation(absl::Seconds(30)));
}

// However the expiry reaches the router first (gRPC's cancellation at the deadline, the worker's
// own DEADLINE_EXCEEDED, a failover cut short), one client deadline is one deadline_exceeded.
TEST_F(RouterServerTest, ClientDeadlineExpiryIsAlwaysCountedAsDeadlineExceeded) {
  StartWorkers(2);
  StartKvdir();
  workers_[0]->SetScript({.block = true});
  workers_[1]->SetScript({.block = true});
  StartRouter(Options());
  const std::vector<absl::Duration> deadlines = {absl::Milliseconds(50), absl::Milliseconds(150),
                                                 absl::Milliseconds(300)};
  for (absl::Duration d : deadlines) {
    EXPECT_EQ(Stream(Request({"doc"}), d).status.error_code(),
              grpc::StatusCode::DEADLINE_EXCEEDED);
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + d));
    lazyattn::v1::CompleteResponse response;
    EXPECT_EQ(stub_->Complete(&ctx, Request({"doc"}), &response).error_code(),
              grpc::StatusCode::DEADLINE_EXCEEDED);
  }
  // A failover cut short: the first worker fails fast, the second holds the call past the
  // deadline.
  workers_[0]->SetScript({.fail_before_first_token = grpc::StatusCode::UNAVAILABLE});
  workers_[1]->SetScript({.fail_before_first_token = grpc::StatusCode::UNAVAILABLE});
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(Stream(Request({"doc"}), absl::Milliseconds(200)).status.error_code(),
              grpc::StatusCode::UNAVAILABLE);  // both failed fast: the client's deadline is not it
  }
  workers_[1]->SetScript({.block = true});
  EXPECT_EQ(Stream(Request({"doc"}), absl::Milliseconds(200)).status.error_code(),
            grpc::StatusCode::DEADLINE_EXCEEDED);
  // The router counts each call once it has ended on its side too.
  const std::string want = absl::StrCat(
      "lazyattn_router_requests_total{model=\"fake-model\",policy=\"cache_aware\",status="
      "\"deadline_exceeded\"} ",
      2 * deadlines.size() + 1);
  const absl::Time until = absl::Now() + absl::Seconds(30);
  while (Metrics().find(want) == std::string::npos && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  const std::string metrics = Metrics();
  EXPECT_THAT(metrics, HasSubstr(want));
  EXPECT_THAT(metrics, HasSubstr("lazyattn_router_requests_total{model=\"fake-model\",policy="
                                 "\"cache_aware\",status=\"cancelled\"} 0"));
  EXPECT_THAT(metrics, HasSubstr("lazyattn_router_requests_total{model=\"fake-model\",policy="
                                 "\"cache_aware\",status=\"unavailable\"} 2"));
}

TEST_F(RouterServerTest, ClientCancellationReachesTheWorker) {
  StartWorkers(1);
  StartKvdir();
  workers_[0]->SetScript({.block = true});
  StartRouter(Options());
  grpc::ClientContext ctx;
  auto reader = stub_->Generate(&ctx, Request({"doc"}));
  ASSERT_TRUE(workers_[0]->WaitForCalls(1, absl::Seconds(30)));
  ctx.TryCancel();
  EXPECT_TRUE(workers_[0]->WaitForCancellation(absl::Seconds(30)));
  GenerateResponse r;
  while (reader->Read(&r)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
}

TEST_F(RouterServerTest, CompleteReturnsHeldBackTextButNeverTokenIdMinusOne) {
  StartWorkers(1);
  FakeWorker::Script script;
  script.tokens = {"Hello", ",", " wor"};
  script.held_back_tail = "ld";  // e.g. held while it could begin the stop string "ldx"
  workers_[0]->SetScript(script);
  StartKvdir();
  StartRouter(Options());
  GenerateRequest request = Request({"some doc"});
  request.mutable_sampling()->add_stop("ldx");
  grpc::ClientContext ctx;
  lazyattn::v1::CompleteResponse response;
  grpc::Status s = stub_->Complete(&ctx, request, &response);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(response.text(), "Hello, world");
  EXPECT_THAT(response.token_ids(), ElementsAre(100, 101, 102));
  // The stream still relays the text-only chunk (its text belongs to the answer).
  StreamResult streamed = Stream(request);
  ASSERT_TRUE(streamed.status.ok()) << streamed.status.error_message();
  EXPECT_THAT(streamed.tokens, ElementsAre("Hello", ",", " wor", "ld"));
}

// Log-probabilities come back from Complete too: one per token id (the text-only chunk has
// none), and none when the request did not ask for them.
TEST_F(RouterServerTest, CompleteReturnsOneLogprobPerTokenIdWhenAsked) {
  StartWorkers(1);
  FakeWorker::Script script;
  script.tokens = {"Hello", ",", " wor"};
  script.held_back_tail = "ld";
  workers_[0]->SetScript(script);
  StartKvdir();
  StartRouter(Options());
  GenerateRequest request = Request({"some doc"});
  request.mutable_sampling()->set_logprobs(true);
  grpc::ClientContext ctx;
  lazyattn::v1::CompleteResponse response;
  grpc::Status s = stub_->Complete(&ctx, request, &response);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_THAT(response.token_ids(), ElementsAre(100, 101, 102));
  EXPECT_THAT(response.logprobs(), ElementsAre(-0.5f, -1.0f, -1.5f));
  request.mutable_sampling()->set_logprobs(false);
  grpc::ClientContext plain_ctx;
  lazyattn::v1::CompleteResponse plain;
  ASSERT_TRUE(stub_->Complete(&plain_ctx, request, &plain).ok());
  EXPECT_TRUE(plain.logprobs().empty());
}

// Text fields are `bytes` on the wire: the router checks their UTF-8 itself and names the field
// (a `string` field made the generated parser refuse the whole call with no message).
TEST_F(RouterServerTest, InvalidUtf8IsInvalidArgumentNamingTheFieldAndCounted) {
  StartWorkers(1);
  StartKvdir();
  StartRouter(Options());
  const std::string bad = "caf\xC3";  // cut short
  struct Case {
    std::function<void(GenerateRequest&)> edit;
    std::string field;
    std::string label;
  };
  const std::vector<Case> cases = {
      {[&](GenerateRequest& r) { r.set_system(bad); }, "system", "system"},
      {[&](GenerateRequest& r) { r.set_question(bad); }, "question", "question"},
      {[&](GenerateRequest& r) { r.mutable_documents(1)->set_id(bad); }, "documents[1].id",
       "documents.id"},
      {[&](GenerateRequest& r) { r.mutable_documents(1)->set_text(bad); }, "documents[1].text",
       "documents.text"},
      {[&](GenerateRequest& r) { r.mutable_sampling()->add_stop(bad); }, "sampling.stop[0]",
       "sampling.stop"},
  };
  for (const Case& c : cases) {
    GenerateRequest r = Request({"fine", "also fine"});
    c.edit(r);
    StreamResult streamed = Stream(r);
    EXPECT_EQ(streamed.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.field;
    EXPECT_THAT(streamed.status.error_message(), HasSubstr(c.field + ": not valid UTF-8"));
    grpc::ClientContext ctx;
    lazyattn::v1::CompleteResponse response;
    grpc::Status s = stub_->Complete(&ctx, r, &response);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.field;
    EXPECT_THAT(s.error_message(), HasSubstr(c.field + ": not valid UTF-8"));
  }
  for (const char* field : {"documents.id", "documents.text"}) {
    grpc::ClientContext ctx;
    lazyattn::v1::PrefetchRequest prefetch;
    auto* doc = prefetch.add_documents();
    doc->set_text("fine");
    if (std::string(field) == "documents.id") {
      doc->set_id(bad);
    } else {
      doc->set_text(bad);
    }
    lazyattn::v1::PrefetchResponse presp;
    grpc::Status s = stub_->Prefetch(&ctx, prefetch, &presp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << field;
    EXPECT_THAT(s.error_message(), HasSubstr("documents[0]."));
    EXPECT_THAT(s.error_message(), HasSubstr("not valid UTF-8"));
  }
  EXPECT_EQ(workers_[0]->generate_calls(), 0);
  EXPECT_EQ(workers_[0]->prefetch_calls(), 0);
  const std::string metrics = Metrics();
  for (const Case& c : cases) {
    const int expected = c.label.rfind("documents.", 0) == 0 ? 3 : 2;  // + one Prefetch each
    EXPECT_THAT(metrics, HasSubstr(absl::StrCat("lazyattn_router_invalid_utf8_requests_total{field=\"",
                                                c.label, "\"} ", expected)))
        << c.label;
  }
}

TEST_F(RouterServerTest, MalformedRequestsAreInvalidArgumentNamingTheField) {
  StartWorkers(1);
  StartKvdir();
  RouterOptions o = Options();
  o.limits.max_documents = 4;
  o.limits.max_document_bytes = 100;
  StartRouter(o);

  struct Case {
    GenerateRequest request;
    std::string field;
  };
  std::vector<Case> cases;
  {
    GenerateRequest r = Request({"a", "b", "c", "", "e"});
    r.mutable_documents()->RemoveLast();
    cases.push_back({r, "documents[3].text: empty document"});
  }
  cases.push_back({Request({"a", "b", "c", "d", "e"}), "documents: 5 documents, the limit is 4"});
  cases.push_back({Request({std::string(101, 'x')}), "documents[0].text: 101 bytes"});
  cases.push_back({Request({}, ""), "question: empty question and no documents"});
  {
    GenerateRequest r = Request({"a"});
    r.mutable_sampling()->set_temperature(-1);
    cases.push_back({r, "sampling.temperature"});
  }
  {
    GenerateRequest r = Request({"a"});
    r.mutable_sampling()->set_max_tokens(1 << 20);
    cases.push_back({r, "sampling.max_tokens"});
  }
  {
    GenerateRequest r = Request({"a"});
    r.set_cache_mode(static_cast<lazyattn::v1::CacheMode>(42));
    cases.push_back({r, "cache_mode: unknown cache mode 42"});
  }
  {
    GenerateRequest r = Request({"a"});
    r.mutable_documents(0)->mutable_tokens()->add_ids(5000);  // vocabulary of the fake: 1000
    cases.push_back({r, "documents[0].tokens.ids[0]: token id 5000 outside the vocabulary"});
  }
  for (const Case& c : cases) {
    StreamResult r = Stream(c.request);
    EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.field;
    EXPECT_THAT(r.status.error_message(), HasSubstr(c.field));
    grpc::ClientContext ctx;
    lazyattn::v1::CompleteResponse response;
    grpc::Status s = stub_->Complete(&ctx, c.request, &response);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.field;
  }
  EXPECT_EQ(workers_[0]->generate_calls(), 0);

  grpc::ClientContext ctx;
  lazyattn::v1::PrefetchRequest prefetch;
  prefetch.add_documents()->set_text("a");
  prefetch.set_replicas(-1);
  lazyattn::v1::PrefetchResponse presp;
  grpc::Status s = stub_->Prefetch(&ctx, prefetch, &presp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("replicas"));
}

TEST_F(RouterServerTest, PrefetchWarmsTheRoutedWorkerOrSeveral) {
  StartWorkers(3);
  StartKvdir();
  kvdir_.Hold("w1", "doc", 500);
  StartRouter(Options());

  lazyattn::v1::PrefetchRequest request;
  request.add_documents()->set_text("doc");
  lazyattn::v1::PrefetchResponse response;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub_->Prefetch(&ctx, request, &response).ok());
    EXPECT_THAT(response.workers(), ElementsAre("w1"));
    EXPECT_EQ(response.computed_tokens(), 3);
  }
  request.set_replicas(3);
  workers_[2]->SetScript({.fail_before_first_token = grpc::StatusCode::UNAVAILABLE});
  {
    grpc::ClientContext ctx;
    response.Clear();
    ASSERT_TRUE(stub_->Prefetch(&ctx, request, &response).ok());
    EXPECT_THAT(response.workers(), UnorderedElementsAre("w0", "w1"));
  }
}

TEST_F(RouterServerTest, GetModelInfoWithoutWorkersIsUnavailable) {
  StartKvdir();  // lists nobody
  StartRouter(Options());
  grpc::ClientContext ctx;
  lazyattn::v1::ModelInfo info;
  EXPECT_EQ(stub_->GetModelInfo(&ctx, {}, &info).error_code(), grpc::StatusCode::UNAVAILABLE);
  StreamResult r = Stream(Request({"doc"}));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(r.status.error_message(), HasSubstr("no live workers"));
}

}  // namespace
}  // namespace lazyattn::router
