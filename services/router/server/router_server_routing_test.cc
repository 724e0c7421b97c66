// Where the router sends a request and what it does when a worker fails: the worker holding the
// documents (in any order) streams the answer, failures before the first token fail over to the
// next worker (after tokens a stream ends, a Complete call still fails over), the router serves
// with the directory down, hanging or absent, a burst for new documents stays on one worker, and
// the circuit breaker and health probes stop sending to a failing worker, and a request with
// logit_bias reaches only workers that apply it.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "lazyattn/v1/inference.grpc.pb.h"
#include "services/router/server/fake_cluster_for_test.h"
#include "services/router/server/router_server.h"
#include "services/router/server/router_server_test_fixture.h"

namespace lazyattn::router {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::RouterServerTest;
using testing::StreamResult;

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
  // The directory's 300 + 200 tokens count as no more than the texts can have (bytes + 16 each,
  // DocumentRef::max_tokens): 25 + 24 a request.
  EXPECT_THAT(metrics,
              HasSubstr("lazyattn_router_predicted_hit_tokens_total{model=\"fake-model\"} 98"));
  EXPECT_THAT(metrics, HasSubstr("lazyattn_router_routing_duration_seconds_count 2"));
}

// The directory says w0 holds "doc alpha" (25 tokens: its bytes + 16, all a text can have). A
// w0 whose answers say it reused them keeps the document's requests; one that reuses nothing
// draws them only until ClaimCredit's min_observations (8) answers showed it, and then its claim
// counts at its credit (0): the requests go by load and speculation, to w1. The prediction for
// w0 stays its claim. What a worker reused is its hits and its block-mode copies.
class ClaimCreditRoutingTest : public RouterServerTest {
 protected:
  // w0 answers that it reused `hits` tokens under the request's key and copied `copied`.
  std::vector<std::string> ServeClaimedDocument(int64_t hits, std::optional<int64_t> copied = 0) {
    StartWorkers(2);
    StartKvdir();
    kvdir_.Hold("w0", "doc alpha", 25);
    workers_[0]->SetScript({.document_hit_tokens = hits, .document_copied_tokens = copied});
    StartRouter(Options());
    std::vector<std::string> served;
    for (int i = 0; i < 16; ++i) {
      StreamResult r = Stream(Request({"doc alpha"}));
      EXPECT_TRUE(r.status.ok()) << r.status.error_message();
      if (!r.final.has_value()) break;
      if (r.final->worker() == "w0") EXPECT_EQ(r.final->predicted_hit_tokens(), 25);
      served.push_back(r.final->worker());
    }
    return served;
  }
};

TEST_F(ClaimCreditRoutingTest, AWorkerWhoseAnswersBearOutItsClaimKeepsItsRequests) {
  // Hits and copies both count: either alone is under half of the 25 claimed.
  const std::vector<std::string> served = ServeClaimedDocument(10, 15);
  EXPECT_EQ(served.size(), 16u);
  EXPECT_THAT(served, ::testing::Each("w0"));
  EXPECT_THAT(Metrics(), HasSubstr("lazyattn_router_workers_distrusted 0"));
}

// A worker that predates Usage.document_copied_tokens has its hits checked alone.
TEST_F(ClaimCreditRoutingTest, AWorkerThatDoesNotReportCopiesIsCheckedOnItsHits) {
  const std::vector<std::string> served = ServeClaimedDocument(25, std::nullopt);
  EXPECT_EQ(served.size(), 16u);
  EXPECT_THAT(served, ::testing::Each("w0"));
}

// A worker answering the largest counts there are overflows nothing (the sanitizer build checks)
// and earns no more than full credit.
TEST_F(ClaimCreditRoutingTest, AWorkerAnsweringHugeReusesOverflowsNothing) {
  constexpr int64_t kHuge = std::numeric_limits<int64_t>::max();
  const std::vector<std::string> served = ServeClaimedDocument(kHuge, kHuge);
  EXPECT_EQ(served.size(), 16u);
  EXPECT_THAT(served, ::testing::Each("w0"));
  EXPECT_THAT(Metrics(), HasSubstr("lazyattn_router_workers_distrusted 0"));
}

TEST_F(ClaimCreditRoutingTest, AWorkerThatReusesNoneOfWhatItClaimsLosesItsRequests) {
  const std::vector<std::string> served = ServeClaimedDocument(0);
  ASSERT_EQ(served.size(), 16u);
  EXPECT_THAT(std::vector<std::string>(served.begin(), served.begin() + 8), ::testing::Each("w0"));
  EXPECT_EQ(served.back(), "w1");
  EXPECT_THAT(Metrics(), HasSubstr("lazyattn_router_workers_distrusted 1"));
}

// The prompt-prefix lengths the router learns from workers (block-mode placement and its
// predicted hits) are kept per cache scope: learnt from one scope's requests, a length would
// tell another scope, through predicted_hit_tokens, that someone sent that system prompt.
TEST_F(RouterServerTest, PromptPrefixLengthsAreLearntPerCacheScope) {
  StartWorkers(1);
  StartKvdir();
  StartRouter(Options());
  const PrefixLengths& lengths = router_->context().selector().prefix_lengths();
  const size_t before = lengths.size();
  for (const char* salt : {"a", "a", "b"}) {
    lazyattn::v1::GenerateRequest r = Request({"doc"});
    r.set_system("You are terse.");
    r.set_cache_mode(lazyattn::v1::CACHE_MODE_BLOCK);
    r.set_cache_salt(salt);
    const StreamResult result = Stream(r);
    ASSERT_TRUE(result.status.ok()) << result.status.error_message();
  }
  EXPECT_EQ(lengths.size(), before + 2);  // scope "a" once, scope "b" once
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

// With the retry budget spent (here: none at all), a request that lost its worker ends with that
// failure instead of failing over, and the refusal is counted; the next worker is never called.
TEST_F(RouterServerTest, ASpentRetryBudgetEndsTheRequestWithItsFailure) {
  StartWorkers(2);
  StartKvdir();
  kvdir_.Hold("w0", "doc", 500);  // w0 is the first choice
  workers_[0]->SetScript({.fail_before_first_token = grpc::StatusCode::UNAVAILABLE});
  RouterOptions options = Options();
  options.routing.retry_budget = {.percent = 0.0, .min_retries = 0};
  StartRouter(options);

  StreamResult r = Stream(Request({"doc"}));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(r.status.error_message(), HasSubstr("1 attempt): w0 ("));
  EXPECT_THAT(r.status.error_message(),
              HasSubstr("failover to w1 not tried: the retry budget is spent (0 failovers in "
                        "flight; routing.retry_budget_percent, retry_budget_min)"));
  EXPECT_EQ(workers_[0]->generate_calls(), 1);
  EXPECT_EQ(workers_[1]->generate_calls(), 0);
  const std::string metrics = Metrics();
  EXPECT_THAT(metrics, HasSubstr("lazyattn_router_retries_refused_total{model=\"fake-model\"} 1"));
  EXPECT_THAT(metrics, HasSubstr("lazyattn_router_retries_total{model=\"fake-model\"} 0"));

  // The default budget (3 failovers at once however few requests) lets it through.
  StartRouter(Options());
  r = Stream(Request({"doc"}));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.final->worker(), "w1");
  EXPECT_EQ(r.final->attempts(), 2);
}

// A worker that hands a request back unstarted (its drain began) did no work for it: the request
// moves to another worker even with no retry budget at all, since nothing is computed twice.
TEST_F(RouterServerTest, ARequestHandedBackUnstartedMovesWithoutTheRetryBudget) {
  StartWorkers(2);
  StartKvdir();
  kvdir_.Hold("w0", "doc", 500);  // w0 is the first choice
  workers_[0]->SetScript(
      {.fail_before_first_token = grpc::StatusCode::UNAVAILABLE, .handed_back = true});
  RouterOptions options = Options();
  options.routing.retry_budget = {.percent = 0.0, .min_retries = 0};
  StartRouter(options);
  StreamResult r = Stream(Request({"doc"}));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.final->worker(), "w1");
  EXPECT_EQ(r.final->attempts(), 2);
  EXPECT_THAT(Metrics(),
              HasSubstr("lazyattn_router_retries_refused_total{model=\"fake-model\"} 0"));
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

// During a rolling upgrade a worker older than logit_bias (ModelInfo.max_logit_bias 0) would
// ignore a request's biases: such a request goes only to workers that apply as many entries as it
// has; when none does it is refused before any worker sees it. Requests without biases still go
// anywhere.
TEST_F(RouterServerTest, LogitBiasGoesOnlyToWorkersThatApplyIt) {
  auto BiasedRequest = [](int doc, int entries) {
    lazyattn::v1::GenerateRequest r = Request({absl::StrCat("biased doc ", doc)});
    for (int k = 0; k < entries; ++k) (*r.mutable_sampling()->mutable_logit_bias())[10 + k] = 1.5f;
    return r;
  };
  StartWorkers(2);
  workers_[0]->SetMaxLogitBias(0);
  workers_[1]->SetMaxLogitBias(2);
  StartKvdir();
  StartRouter(Options());
  {
    // What a client may send: the best worker's count (within the router's limit, 300), not
    // the first-reporting worker's.
    grpc::ClientContext ctx;
    lazyattn::v1::ModelInfo info;
    ASSERT_TRUE(stub_->GetModelInfo(&ctx, {}, &info).ok());
    EXPECT_EQ(info.max_logit_bias(), 2);
  }
  for (int i = 0; i < 6; ++i) {  // different documents: the plan's first choice varies
    StreamResult r = Stream(BiasedRequest(i, /*entries=*/2));
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  }
  EXPECT_EQ(workers_[0]->generate_calls(), 0);
  EXPECT_EQ(workers_[1]->generate_calls(), 6);

  // More entries than any worker applies: FAILED_PRECONDITION naming the field and the most any
  // worker applies, none called. The client's error: no worker id or address in it.
  StreamResult refused = Stream(BiasedRequest(0, /*entries=*/3));
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(refused.status.error_message(),
              HasSubstr("sampling.logit_bias: the request has 3 entries, and no live worker of "
                        "its model applies more than 2"));
  EXPECT_THAT(refused.status.error_message(), Not(HasSubstr("127.0.0.1")));
  EXPECT_THAT(refused.status.error_message(), Not(HasSubstr("w0")));
  EXPECT_EQ(workers_[0]->generate_calls() + workers_[1]->generate_calls(), 6);

  // Without biases the old worker serves as before.
  for (int i = 0; i < 6; ++i) {
    ASSERT_TRUE(Stream(Request({absl::StrCat("plain doc ", i)})).status.ok());
  }
  EXPECT_EQ(workers_[0]->generate_calls() + workers_[1]->generate_calls(), 12);
}

// The worker that applies the biases is out of the plans for now (its breaker opened): the
// request is UNAVAILABLE, worth retrying, not FAILED_PRECONDITION, which says no worker of the
// model ever could.
TEST_F(RouterServerTest, LogitBiasWhileTheOnlyWorkerApplyingItIsEjectedIsUnavailable) {
  StartWorkers(2);
  workers_[0]->SetMaxLogitBias(0);
  workers_[1]->SetScript({.fail_before_first_token = grpc::StatusCode::UNAVAILABLE});
  StartKvdir();
  RouterOptions o = Options();
  o.routing.breaker = {.failure_threshold = 2, .open_duration = absl::Hours(1)};
  StartRouter(o);
  lazyattn::v1::GenerateRequest biased = Request({"doc"});
  (*biased.mutable_sampling()->mutable_logit_bias())[10] = 1.5f;
  for (int i = 0; i < 2; ++i) {  // w1 fails them (w0 is skipped): its breaker opens
    EXPECT_EQ(Stream(biased).status.error_code(), grpc::StatusCode::UNAVAILABLE);
  }
  EXPECT_EQ(workers_[1]->generate_calls(), 2);
  const StreamResult r = Stream(biased);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::UNAVAILABLE) << r.status.error_message();
  EXPECT_THAT(r.status.error_message(), HasSubstr("w0 ("));
  EXPECT_EQ(workers_[0]->generate_calls() + workers_[1]->generate_calls(), 2);
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

// A black-holed directory: after kvdir.lookup_failures_to_skip lookups in a row time out, requests
// route by load without one (they do not each pay the lookup timeout), until a trial lookup
// after the backoff answers.
TEST_F(RouterServerTest, LookupsAreSkippedWhileTheDirectoryKeepsFailing) {
  StartWorkers(2);
  StartKvdir();
  RouterOptions o = Options();
  o.kvdir.lookup_timeout = absl::Milliseconds(50);
  o.kvdir.lookup_gate = {.failures_to_skip = 3,
                         .base_backoff = absl::Milliseconds(500),
                         .max_backoff = absl::Milliseconds(500)};
  StartRouter(o);
  kvdir_.SetHang(true);
  for (int i = 0; i < 6; ++i) {
    StreamResult r = Stream(Request({"doc"}), absl::Seconds(30));
    ASSERT_TRUE(r.status.ok()) << i << ": " << r.status.error_message();
  }
  EXPECT_EQ(kvdir_.lookups(), 3) << "the three after the third failure skip their lookup";
  EXPECT_THAT(Metrics(), HasSubstr("lazyattn_router_kvdir_lookups_skipped_total 3"));

  kvdir_.SetHang(false);
  absl::SleepFor(absl::Milliseconds(600));  // the backoff passes: one trial, which answers
  for (int i = 0; i < 2; ++i) {
    StreamResult r = Stream(Request({"doc"}), absl::Seconds(30));
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  }
  EXPECT_EQ(kvdir_.lookups(), 5) << "the trial answered: lookups resumed";
}

// A lookup kvdir refuses as invalid (more keys than its limits.max_keys_per_lookup, a router's
// limits.max_documents set above it) is that request's, not a sign the directory is down: it
// routes by load, and the next requests still look up.
TEST_F(RouterServerTest, ALookupRefusedAsInvalidDoesNotCountAsTheDirectoryFailing) {
  StartWorkers(2);
  StartKvdir();
  RouterOptions o = Options();
  o.kvdir.lookup_gate = {
      .failures_to_skip = 3, .base_backoff = absl::Seconds(30), .max_backoff = absl::Seconds(30)};
  StartRouter(o);
  kvdir_.SetMaxKeysPerLookup(1);
  for (int i = 0; i < 5; ++i) {
    StreamResult r = Stream(Request({"doc a", "doc b"}), absl::Seconds(30));
    ASSERT_TRUE(r.status.ok()) << i << ": " << r.status.error_message();
  }
  EXPECT_EQ(kvdir_.lookups(), 5) << "no lookup was skipped";
  EXPECT_THAT(Metrics(), Not(HasSubstr("lazyattn_router_kvdir_lookups_skipped_total 1")));
  StreamResult r = Stream(Request({"doc a"}), absl::Seconds(30));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(kvdir_.lookups(), 6);
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

// A request planned while w0's breaker was open has only w1 in its plan. When w1 then freezes,
// the failover looks again and finds w0 recovered: it was never tried, so it is (before, the
// request ended UNAVAILABLE after one attempt while w0 stood idle).
TEST_F(RouterServerTest, FailoverTriesAWorkerThatRecoveredAfterThePlanLeftItOut) {
  StartWorkers(2);
  StartKvdir();
  kvdir_.Hold("w0", "doc", 500);  // w0 would be first
  workers_[0]->SetScript({.fail_before_first_token = grpc::StatusCode::UNAVAILABLE});
  RouterOptions o = Options();
  o.routing.breaker = {.failure_threshold = 1, .open_duration = absl::Seconds(2)};
  o.routing.first_token_timeout = absl::Seconds(3);
  StartRouter(o);
  StreamResult r = Stream(Request({"doc"}));  // w0 fails: its breaker opens for 2 s
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.final->worker(), "w1");
  workers_[0]->SetScript({});
  workers_[1]->SetScript({.block = true});
  // Planned within the 2 s: [w1]. w1 sends no token for 3 s; by then w0's breaker lets a probe by.
  r = Stream(Request({"doc"}));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.final->worker(), "w0");
  EXPECT_EQ(r.final->attempts(), 2);
  EXPECT_EQ(workers_[0]->generate_calls(), 2);
  workers_[1]->Unblock();
}

// A model served by one worker whose breaker is half-open: while the probe is out, other requests
// are still sent there (every worker of the model is out, so the selector offers it anyway), and
// they succeed. (The race in which the probe is taken between a request's plan and its send goes
// through PlanCursor, covered by plan_cursor_test.cc.)
TEST_F(RouterServerTest, TheOnlyWorkerServesOthersWhileItsProbeIsOut) {
  StartWorkers(1);
  StartKvdir();
  workers_[0]->SetScript({.fail_before_first_token = grpc::StatusCode::UNAVAILABLE});
  RouterOptions o = Options();
  o.routing.breaker = {.failure_threshold = 1, .open_duration = absl::Milliseconds(300)};
  StartRouter(o);
  EXPECT_EQ(Stream(Request({"doc"})).status.error_code(), grpc::StatusCode::UNAVAILABLE);
  absl::SleepFor(absl::Milliseconds(400));  // the open period passes: the next request probes
  workers_[0]->SetScript({.block = true});
  grpc::ClientContext probe_ctx;
  auto probe = stub_->Generate(&probe_ctx, Request({"doc"}));
  ASSERT_TRUE(workers_[0]->WaitForCalls(2, absl::Seconds(30)));
  workers_[0]->SetScript({});
  for (int i = 0; i < 2; ++i) {
    const StreamResult r = Stream(Request({"doc"}));
    ASSERT_TRUE(r.status.ok()) << i << ": " << r.status.error_message();
    EXPECT_EQ(r.final->worker(), "w0");
  }
  workers_[0]->Unblock();
  lazyattn::v1::GenerateResponse message;
  while (probe->Read(&message)) {
  }
  EXPECT_TRUE(probe->Finish().ok());
  EXPECT_EQ(workers_[0]->generate_calls(), 4);
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
  ASSERT_THAT(MetricsOnceContaining("lazyattn_router_worker_ejections_total 1", absl::Seconds(20)),
              HasSubstr("lazyattn_router_worker_ejections_total 1"));
  // No request is sent to it any more: the first attempt goes to w1.
  StreamResult r = Stream(Request({"doc"}));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.final->worker(), "w1");
  EXPECT_EQ(r.final->attempts(), 1);
}

}  // namespace
}  // namespace lazyattn::router
