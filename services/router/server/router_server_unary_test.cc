// The router's unary calls: Complete returns the whole text with its token ids (text a worker held
// back included, never its id -1) and log-probabilities when asked, Prefetch warms the routed
// worker or several, and GetModelInfo without workers is UNAVAILABLE.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "lazyattn/v1/inference.grpc.pb.h"
#include "services/router/policy/worker_selector.h"
#include "services/router/server/fake_cluster_for_test.h"
#include "services/router/server/prefetch_call.h"
#include "services/router/server/router_server.h"
#include "services/router/server/router_server_test_fixture.h"

namespace lazyattn::router {
namespace {

using lazyattn::v1::GenerateRequest;
using ::testing::ElementsAre;
using testing::FakeWorker;
using ::testing::HasSubstr;
using testing::RouterServerTest;
using testing::StreamResult;
using ::testing::UnorderedElementsAre;

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
  EXPECT_THAT(response.token_bytes(), ElementsAre("Hello", ",", " wor"));
  request.mutable_sampling()->set_logprobs(false);
  grpc::ClientContext plain_ctx;
  lazyattn::v1::CompleteResponse plain;
  ASSERT_TRUE(stub_->Complete(&plain_ctx, request, &plain).ok());
  EXPECT_TRUE(plain.logprobs().empty());
  EXPECT_TRUE(plain.token_bytes().empty());
}

// The alternatives come back too: Complete has one list per token id (none for the text-only
// chunk), as the worker sent them; a stream relays each chunk's list as it came.
// One fake worker running `script` (advertising `max_top_logprobs` alternatives), and requests
// that ask for `top_logprobs` of them.
class RouterAlternativesTest : public RouterServerTest {
 protected:
  GenerateRequest Start(const FakeWorker::Script& script, int max_top_logprobs, int top_logprobs) {
    StartWorkers(1);
    workers_[0]->SetMaxTopLogprobs(max_top_logprobs);
    workers_[0]->SetScript(script);
    StartKvdir();
    StartRouter(Options());
    GenerateRequest request = Request({"some doc"});
    request.mutable_sampling()->set_logprobs(true);
    request.mutable_sampling()->set_top_logprobs(top_logprobs);
    return request;
  }
};

TEST_F(RouterAlternativesTest, CompleteAndGenerateReturnTheAlternativesWhenAsked) {
  FakeWorker::Script script;
  script.tokens = {"Hello", " wor"};
  script.held_back_tail = "ld";
  GenerateRequest request = Start(script, /*max_top_logprobs=*/20, /*top_logprobs=*/3);
  grpc::ClientContext ctx;
  lazyattn::v1::CompleteResponse response;
  grpc::Status s = stub_->Complete(&ctx, request, &response);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(workers_[0]->last_request().sampling().top_logprobs(), 3);
  EXPECT_THAT(response.token_ids(), ElementsAre(100, 101));
  EXPECT_THAT(response.logprobs(), ElementsAre(-0.5f, -1.0f));
  ASSERT_EQ(response.top_logprobs_size(), 2);
  // The fake worker's alternatives (fake_cluster_for_test.h): the token, then 901, 902.
  auto entries = [](const lazyattn::v1::TopLogprobs& top) {
    std::vector<std::tuple<int, float, std::string>> out;
    for (const lazyattn::v1::TopLogprob& e : top.entries()) {
      out.emplace_back(e.token_id(), e.logprob(), e.token_bytes());
    }
    return out;
  };
  using Entry = std::tuple<int, float, std::string>;
  EXPECT_THAT(entries(response.top_logprobs(0)),
              ElementsAre(Entry{100, -0.5f, "Hello"}, Entry{901, -1.5f, "alt1"},
                          Entry{902, -2.5f, "alt2"}));
  EXPECT_THAT(
      entries(response.top_logprobs(1)),
      ElementsAre(Entry{101, -1.0f, " wor"}, Entry{901, -2.0f, "alt1"}, Entry{902, -3.0f, "alt2"}));

  StreamResult streamed = Stream(request);
  ASSERT_TRUE(streamed.status.ok()) << streamed.status.error_message();
  ASSERT_EQ(streamed.chunks.size(), 3u);
  for (int i = 0; i < 2; ++i) {
    lazyattn::v1::TopLogprobs relayed;
    *relayed.mutable_entries() = streamed.chunks[i].top_logprobs();
    EXPECT_EQ(entries(relayed), entries(response.top_logprobs(i)));
  }
  EXPECT_EQ(streamed.chunks[2].token_id(), -1);
  EXPECT_TRUE(streamed.chunks[2].top_logprobs().empty());

  // Not asked for: none.
  request.mutable_sampling()->set_top_logprobs(0);
  grpc::ClientContext plain_ctx;
  lazyattn::v1::CompleteResponse plain;
  ASSERT_TRUE(stub_->Complete(&plain_ctx, request, &plain).ok());
  EXPECT_THAT(plain.logprobs(), ElementsAre(-0.5f, -1.0f));
  EXPECT_TRUE(plain.top_logprobs().empty());
}

// A worker that does not advertise alternatives (ModelInfo.max_top_logprobs 0, one older than
// them) whose tokens do not all carry some: Complete returns none rather than lists that no
// longer line up with the token ids.
TEST_F(RouterAlternativesTest, CompleteReturnsNoAlternativesUnlessEveryTokenHadThem) {
  FakeWorker::Script script;
  script.tokens = {"a", "b", "c"};
  script.edit_token = [](int i, lazyattn::v1::TokenChunk* chunk) {
    if (i == 1) chunk->clear_top_logprobs();
  };
  GenerateRequest request = Start(script, /*max_top_logprobs=*/0, /*top_logprobs=*/2);
  grpc::ClientContext ctx;
  lazyattn::v1::CompleteResponse response;
  grpc::Status s = stub_->Complete(&ctx, request, &response);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_THAT(response.token_ids(), ElementsAre(100, 101, 102));
  EXPECT_EQ(response.logprobs_size(), 3);
  EXPECT_TRUE(response.top_logprobs().empty());
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

// A Prefetch answer adds the replicas' counts: a hostile worker's INT64_MAX (or a negative count)
// does not overflow the sum the client gets; each replica's count is taken within [0, 2^40].
TEST_F(RouterServerTest, PrefetchCountsOfHostileWorkersDoNotOverflowTheSum) {
  StartWorkers(3);
  StartKvdir();
  workers_[0]->SetScript({.prefetch_computed_tokens = std::numeric_limits<int64_t>::max()});
  workers_[1]->SetScript({.prefetch_computed_tokens = std::numeric_limits<int64_t>::max()});
  workers_[2]->SetScript({.prefetch_computed_tokens = -5});
  StartRouter(Options());
  lazyattn::v1::PrefetchRequest request;
  request.add_documents()->set_text("doc");
  request.set_replicas(3);
  grpc::ClientContext ctx;
  lazyattn::v1::PrefetchResponse response;
  ASSERT_TRUE(stub_->Prefetch(&ctx, request, &response).ok());
  EXPECT_THAT(response.workers(), UnorderedElementsAre("w0", "w1", "w2"));
  EXPECT_EQ(response.computed_tokens(), 2 * kMaxObservedTokens);
}

// A worker ending its call with a status code outside gRPC's 0-16 (grpc-status is its own text)
// is relayed as UNKNOWN, as gRPC's clients read such a code, naming the number.
TEST_F(RouterServerTest, AWorkersStatusCodeOutsideGrpcsIsUnknown) {
  StartWorkers(1);
  StartKvdir();
  // 31: past gRPC's codes, yet a value the enum can hold (its enumerators -1..16 give it the
  // range -32..31); a larger one would be undefined behaviour in this test's own fake.
  workers_[0]->SetScript({.fail_before_first_token = static_cast<grpc::StatusCode>(31)});
  StartRouter(Options());
  GenerateRequest request;
  request.set_question("q?");
  grpc::ClientContext ctx;
  lazyattn::v1::CompleteResponse response;
  const grpc::Status s = stub_->Complete(&ctx, request, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNKNOWN) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("status code 31 (not a gRPC code)"));
}

// A frozen worker does not hold a Prefetch (whose client may set no deadline) for ever: past
// routing.prefetch_timeout_ms its call is cancelled and counted against it. The documents do not
// go to another worker (a Prefetch larger than the timeout allows would cost each in turn).
TEST_F(RouterServerTest, PrefetchTimeoutEndsTheCallToAFrozenWorker) {
  StartWorkers(2);
  StartKvdir();
  kvdir_.Hold("w1", "doc", 500);  // w1 is the first choice
  workers_[1]->SetScript({.block = true});
  RouterOptions o = Options();
  o.routing.prefetch_timeout = absl::Milliseconds(300);
  o.routing.breaker = {.failure_threshold = 1, .open_duration = absl::Hours(1)};
  StartRouter(o);
  lazyattn::v1::PrefetchRequest request;
  request.add_documents()->set_text("doc");
  lazyattn::v1::PrefetchResponse response;
  {
    grpc::ClientContext ctx;  // no deadline
    const grpc::Status s = stub_->Prefetch(&ctx, request, &response);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr("w1"));
    EXPECT_THAT(s.error_message(), HasSubstr("routing.prefetch_timeout_ms"));
  }
  EXPECT_TRUE(workers_[1]->WaitForCancellation(absl::Seconds(10)));
  EXPECT_EQ(workers_[0]->prefetch_calls(), 0);
  EXPECT_THAT(Metrics(),
              HasSubstr("lazyattn_router_prefetch_timeouts_total{model=\"fake-model\"} 1"));
  // Counted against w1's breaker: the next Prefetch goes to w0.
  grpc::ClientContext ctx;
  response.Clear();
  const grpc::Status s = stub_->Prefetch(&ctx, request, &response);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_THAT(response.workers(), ElementsAre("w0"));
  workers_[1]->Unblock();
}

// The deadline that ended a Prefetch worker call is the earlier one, whenever the call's end was
// seen: a client deadline 10 ms after the router's timeout is still the router's timeout (the
// worker is blamed), one 10 ms before is the client's (it is not).
TEST(WhichPrefetchDeadlineTest, TheEarlierDeadlineEndedTheCall) {
  const absl::Time ours = absl::FromUnixSeconds(1000);
  EXPECT_EQ(WhichPrefetchDeadline(ours, ours + absl::Milliseconds(10)), PrefetchDeadline::kRouters);
  EXPECT_EQ(WhichPrefetchDeadline(ours, ours - absl::Milliseconds(10)), PrefetchDeadline::kClients);
  EXPECT_EQ(WhichPrefetchDeadline(ours, ours), PrefetchDeadline::kClients);
  EXPECT_EQ(WhichPrefetchDeadline(ours, absl::InfiniteFuture()), PrefetchDeadline::kRouters);
  EXPECT_EQ(WhichPrefetchDeadline(absl::InfiniteFuture(), ours), PrefetchDeadline::kClients);
  EXPECT_EQ(WhichPrefetchDeadline(absl::InfiniteFuture(), absl::InfiniteFuture()),
            PrefetchDeadline::kClients)
      << "no timeout and no client deadline: never ours";
}

// A client whose own deadline passes during a Prefetch says nothing about the worker: its breaker
// stays closed however many such calls end.
TEST_F(RouterServerTest, APrefetchClientsOwnDeadlineDoesNotCountAgainstTheWorker) {
  StartWorkers(2);
  StartKvdir();
  kvdir_.Hold("w1", "doc", 500);
  workers_[1]->SetScript({.block = true});
  RouterOptions o = Options();
  o.routing.breaker = {.failure_threshold = 1, .open_duration = absl::Hours(1)};
  StartRouter(o);
  lazyattn::v1::PrefetchRequest request;
  request.add_documents()->set_text("doc");
  for (int i = 0; i < 3; ++i) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
    lazyattn::v1::PrefetchResponse response;
    EXPECT_EQ(stub_->Prefetch(&ctx, request, &response).error_code(),
              grpc::StatusCode::DEADLINE_EXCEEDED);
  }
  EXPECT_EQ(workers_[0]->prefetch_calls(), 0) << "w1's breaker opened on its clients' deadlines";
  workers_[1]->Unblock();
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
