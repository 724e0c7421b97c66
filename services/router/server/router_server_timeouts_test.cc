// Time limits on a request: the first-token and between-tokens timeouts cut a frozen worker (a
// long prefill that sends progress events is not cut), the client's deadline and cancellation
// reach the worker, each deadline counted once as deadline_exceeded, and a client that stops
// reading, or reads too slowly, is cut (routing.client_write_timeout_ms, _wait_budget_ms).
#include <fcntl.h>
#include <gmock/gmock.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "lazyattn/v1/inference.grpc.pb.h"
#include "services/router/server/router_server.h"
#include "services/router/server/router_server_test_fixture.h"

namespace lazyattn::router {
namespace {

using lazyattn::v1::GenerateResponse;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::RouterServerTest;

// A plaintext channel to `port` whose streams' flow-control windows start and stay at 1 KiB, so
// that a client that reads slowly, or not at all, soon leaves the router's writes waiting.
std::shared_ptr<grpc::Channel> SmallWindowChannel(int port) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);                  // the window stays small...
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 1024);  // ...and starts small
  return grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", port),
                                   grpc::InsecureChannelCredentials(), args);
}

// Waits up to `limit` for the router to have no call in flight (the cut call's admission slot
// given back), then expects that and exactly one call cut by the client write watch.
void ExpectOneCallCutAndNoneInFlight(const std::function<std::string()>& metrics,
                                     absl::Duration limit) {
  const absl::Time until = absl::Now() + limit;
  while (absl::Now() < until &&
         metrics().find("lazyattn_router_in_flight_requests 0") == std::string::npos) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  const std::string text = metrics();
  EXPECT_THAT(text, HasSubstr("lazyattn_router_client_write_timeouts_total 1"));
  EXPECT_THAT(text, HasSubstr("lazyattn_router_in_flight_requests 0"));
}
using testing::StreamResult;

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

  // Events after the first token (out of place, tolerated and dropped) reach no client either.
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
  const std::string metrics = MetricsOnceContaining(want);
  EXPECT_THAT(metrics, HasSubstr(want));
  EXPECT_THAT(metrics, HasSubstr("lazyattn_router_requests_total{model=\"fake-model\",policy="
                                 "\"cache_aware\",status=\"cancelled\"} 0"));
  EXPECT_THAT(metrics, HasSubstr("lazyattn_router_requests_total{model=\"fake-model\",policy="
                                 "\"cache_aware\",status=\"unavailable\"} 2"));
}

// A client that keeps its connection but reads nothing (its flow-control window fills) does not
// hold its admission slot and its worker's request until its deadline, which it did not set:
// past routing.client_write_timeout_ms the call is cancelled, and so is the worker's.
TEST_F(RouterServerTest, AStreamWhoseClientStopsReadingIsCancelled) {
  StartWorkers(1);
  StartKvdir();
  // Endless: the worker is still sending when the call is cut, however much the windows hold.
  workers_[0]->SetScript({.tokens = std::vector<std::string>(1000, "token "), .endless = true});
  RouterOptions o = Options();
  o.routing.client_write_timeout = absl::Milliseconds(300);
  o.routing.token_idle_timeout = absl::ZeroDuration();  // only the client is slow here
  StartRouter(o);
  // The access line says the router cut the call (it said "cancelled by the client").
  const std::string log_path = absl::StrCat(::testing::TempDir(), "/router-cut-log-", getpid());
  const int log_fd = open(log_path.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0600);
  ASSERT_GE(log_fd, 0);
  SetLogSinkForTest(log_fd);
  auto stub = lazyattn::v1::Inference::NewStub(SmallWindowChannel(router_->port()));
  grpc::ClientContext ctx;  // no deadline
  auto reader = stub->Generate(&ctx, Request({"doc"}));
  ASSERT_TRUE(workers_[0]->WaitForCalls(1, absl::Seconds(30)));
  EXPECT_TRUE(workers_[0]->WaitForCancellation(absl::Seconds(30)))
      << "the worker's request was never cancelled";
  ExpectOneCallCutAndNoneInFlight([this] { return Metrics(); }, absl::Seconds(10));
  ctx.TryCancel();
  lazyattn::v1::GenerateResponse m;
  while (reader->Read(&m)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  SetLogSinkForTest(STDERR_FILENO);
  close(log_fd);
  std::ifstream log(log_path);
  const std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_THAT(text, HasSubstr("cut by the router: the client did not read its answer within "
                              "routing.client_write_timeout_ms"));
  EXPECT_THAT(text, Not(HasSubstr("cancelled by the client")));
  std::remove(log_path.c_str());
}

// A client that reads, but slower than tokens come, never leaves one write waiting for the
// timeout (off here), yet its writes wait more and more in all: past
// routing.client_write_wait_budget_ms the call is cancelled, and so is the worker's.
TEST_F(RouterServerTest, AStreamWhoseClientReadsTooSlowlyIsCancelledAtItsWaitBudget) {
  StartWorkers(1);
  StartKvdir();
  // More than any window holds (100,000 tokens, 1.5 MB, were all buffered once the windows had
  // grown, and the worker's call ended before the cut), so the worker is still sending when the
  // call is cut.
  workers_[0]->SetScript({.tokens = std::vector<std::string>(1000, "token "), .endless = true});
  RouterOptions o = Options();
  o.routing.client_write_timeout = absl::ZeroDuration();
  o.routing.client_write_wait_budget = absl::Milliseconds(500);
  o.routing.token_idle_timeout = absl::ZeroDuration();  // only the client is slow here
  StartRouter(o);
  auto stub = lazyattn::v1::Inference::NewStub(SmallWindowChannel(router_->port()));
  grpc::ClientContext ctx;  // no deadline
  auto reader = stub->Generate(&ctx, Request({"doc"}));
  GenerateResponse m;
  int read = 0;
  const absl::Time give_up = absl::Now() + absl::Seconds(60);
  bool ended = false;
  while (absl::Now() < give_up && !ended) {  // one message every 20 ms: 50 a second
    ended = !reader->Read(&m);
    read += ended ? 0 : 1;
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_TRUE(ended) << "the slow stream was not cut";
  if (!ended) ctx.TryCancel();  // so that Finish returns
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_GT(read, 10) << "the client did read";
  EXPECT_TRUE(workers_[0]->WaitForCancellation(absl::Seconds(30)));
  EXPECT_THAT(Metrics(), HasSubstr("lazyattn_router_client_write_timeouts_total 1"));
}

// A client that reads as tokens come is not cut: through a 1 KiB window its writes do wait for
// the client's window updates, each far under the 5 ms a write may wait uncounted, so 900 of them
// stay inside a wait budget of 1 s.
TEST_F(RouterServerTest, AStreamReadAsItComesStaysInsideItsWaitBudget) {
  StartWorkers(1);
  StartKvdir();
  workers_[0]->SetScript({.tokens = std::vector<std::string>(900, "token ")});
  RouterOptions o = Options();
  o.routing.client_write_timeout = absl::ZeroDuration();
  o.routing.client_write_wait_budget = absl::Seconds(1);
  StartRouter(o);
  auto stub = lazyattn::v1::Inference::NewStub(SmallWindowChannel(router_->port()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  auto reader = stub->Generate(&ctx, Request({"doc"}));
  GenerateResponse m;
  int tokens = 0;
  while (reader->Read(&m)) tokens += m.has_token() ? 1 : 0;
  const grpc::Status status = reader->Finish();
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(tokens, 900);
  EXPECT_THAT(Metrics(), HasSubstr("lazyattn_router_client_write_timeouts_total 0"));
}

// The same for a unary Complete whose answer is larger than the client's window and which the
// client never reads: the call is cut at the timeout (after the answer's time at 64 KiB/s, here
// ~3 s) and its admission slot freed. (A generic
// call on Complete's method: gRPC's async unary API sends the request only with Finish, which
// also reads the answer.)
TEST_F(RouterServerTest, ACompleteWhoseClientDoesNotReadTheAnswerIsCancelled) {
  StartWorkers(1);
  StartKvdir();
  // ~180 KB of answer (the text twice); the fake model has 1,000 token ids.
  workers_[0]->SetScript({.tokens = std::vector<std::string>(900, std::string(100, 'x'))});
  RouterOptions o = Options();
  o.routing.client_write_timeout = absl::Milliseconds(300);
  StartRouter(o);
  grpc::GenericStub stub(SmallWindowChannel(router_->port()));
  grpc::CompletionQueue cq;
  grpc::ClientContext ctx;  // no deadline
  auto call = stub.PrepareCall(&ctx, "/lazyattn.v1.Inference/Complete", &cq);
  grpc::ByteBuffer request;
  bool own_buffer = false;
  ASSERT_TRUE(grpc::SerializationTraits<lazyattn::v1::GenerateRequest>::Serialize(
                  Request({"doc"}), &request, &own_buffer)
                  .ok());
  auto await_tag = [&cq] {
    void* tag = nullptr;
    bool ok = false;
    return cq.Next(&tag, &ok) && ok;
  };
  int tag = 0;  // one operation at a time; EXPECT, not ASSERT, up to the poller's join
  call->StartCall(&tag);
  bool sent = await_tag();
  if (sent) call->Write(request, &tag);
  sent = sent && await_tag();
  if (sent) call->WritesDone(&tag);
  sent = sent && await_tag();
  EXPECT_TRUE(sent) << "the request was not sent";
  std::thread poller([&cq] {  // drives the call from here on; nothing reads its answer
    void* tag = nullptr;
    bool ok = false;
    while (cq.Next(&tag, &ok)) {
    }
  });
  EXPECT_TRUE(sent && workers_[0]->WaitForCalls(1, absl::Seconds(30)));
  ExpectOneCallCutAndNoneInFlight([this] { return Metrics(); }, absl::Seconds(sent ? 30 : 0));
  // Its unread answer would keep a Finish from completing: the client gives up too.
  ctx.TryCancel();
  grpc::Status status;
  call->Finish(&status, &call);
  cq.Shutdown();  // the poller takes Finish's tag, then ends
  poller.join();
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

// A client cancelling a stream that is sending tokens is counted cancelled, never as a worker
// failure: the worker call inherits the cancellation and may end before the router's OnCancel
// runs, and a stream past its first token is not retried, so UNAVAILABLE would have blamed the
// worker in the metrics and the log.
TEST_F(RouterServerTest, ClientsCancellingMidStreamAreCountedCancelled) {
  StartWorkers(1);
  StartKvdir();
  // Ten tokens, then the worker waits (mid-generation) until the call is cancelled.
  workers_[0]->SetScript(
      {.tokens = std::vector<std::string>(20, "token "), .block_after_tokens = 10});
  StartRouter(Options());
  constexpr int kStreams = 20;
  for (int i = 0; i < kStreams; ++i) {
    grpc::ClientContext ctx;
    auto reader = stub_->Generate(&ctx, Request({"doc"}));
    GenerateResponse r;
    for (int read = 0; read < 5 && reader->Read(&r); ++read) {
    }
    ctx.TryCancel();
    while (reader->Read(&r)) {
    }
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  const std::string want = absl::StrCat(
      "lazyattn_router_requests_total{model=\"fake-model\",policy=\"cache_aware\",status="
      "\"cancelled\"} ",
      kStreams);
  const std::string metrics = MetricsOnceContaining(want);
  EXPECT_THAT(metrics, HasSubstr(want));
  EXPECT_THAT(metrics, HasSubstr("lazyattn_router_requests_total{model=\"fake-model\",policy="
                                 "\"cache_aware\",status=\"unavailable\"} 0"));
  EXPECT_THAT(metrics, HasSubstr("lazyattn_router_worker_protocol_errors_total{model="
                                 "\"fake-model\"} 0"));
}

// Calls still running when a router's shutdown grace ends are cut by gRPC (the clients see
// UNAVAILABLE); they were logged and counted as cancelled by their clients, so a restart read as
// clients leaving. They count as unavailable now.
TEST_F(RouterServerTest, CallsCutByTheRoutersShutdownAreNotCountedAsClientsCancelling) {
  StartWorkers(1);
  StartKvdir();
  workers_[0]->SetScript(
      {.tokens = std::vector<std::string>(20, "token "), .block_after_tokens = 2});
  StartRouter(Options());
  constexpr int kStreams = 3;
  std::vector<grpc::StatusCode> codes(kStreams, grpc::StatusCode::OK);
  std::vector<std::thread> readers;
  for (int i = 0; i < kStreams; ++i) {
    readers.emplace_back([this, &codes, i] {
      grpc::ClientContext ctx;
      auto reader = stub_->Generate(&ctx, Request({"doc"}));
      GenerateResponse r;
      while (reader->Read(&r)) {
      }
      codes[i] = reader->Finish().error_code();
    });
  }
  ASSERT_TRUE(workers_[0]->WaitForCalls(kStreams, absl::Seconds(10)));
  router_->Shutdown(absl::Milliseconds(200));
  for (std::thread& t : readers) t.join();
  for (grpc::StatusCode code : codes) EXPECT_EQ(code, grpc::StatusCode::UNAVAILABLE);
  const std::string want = absl::StrCat(
      "lazyattn_router_requests_total{model=\"fake-model\",policy=\"cache_aware\",status="
      "\"unavailable\"} ",
      kStreams);
  const std::string metrics = MetricsOnceContaining(want);
  EXPECT_THAT(metrics, HasSubstr(want));
  EXPECT_THAT(metrics, HasSubstr("lazyattn_router_requests_total{model=\"fake-model\",policy="
                                 "\"cache_aware\",status=\"cancelled\"} 0"));
}

// A Prefetch whose client went away while the directory lookup ran starts no worker call when
// the lookup ends (here by its timeout: the directory hangs), and the reactor finishes.
TEST_F(RouterServerTest, PrefetchCancelledDuringTheLookupWarmsNoWorker) {
  StartWorkers(2);
  StartKvdir();
  kvdir_.SetHang(true);
  RouterOptions o = Options();
  o.kvdir.lookup_timeout = absl::Milliseconds(400);
  StartRouter(o);
  const int lookups_before = kvdir_.lookups();
  lazyattn::v1::PrefetchRequest request;
  request.add_documents()->set_text("doc");
  request.set_replicas(2);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(100));
  lazyattn::v1::PrefetchResponse response;
  const grpc::Status s = stub_->Prefetch(&ctx, request, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << s.error_message();
  EXPECT_GT(kvdir_.lookups(), lookups_before);  // it did reach the lookup
  // The lookup times out at 400 ms; a plan by load alone would then call both workers.
  absl::SleepFor(absl::Milliseconds(800));
  EXPECT_EQ(workers_[0]->prefetch_calls() + workers_[1]->prefetch_calls(), 0);
  // The reactor is done: its admission slot is free again for the next request.
  kvdir_.SetHang(false);
  grpc::ClientContext ctx2;
  ASSERT_TRUE(stub_->Prefetch(&ctx2, request, &response).ok());
  EXPECT_EQ(workers_[0]->prefetch_calls() + workers_[1]->prefetch_calls(), 2);
}

}  // namespace
}  // namespace lazyattn::router
