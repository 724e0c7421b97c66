// How a request ends early without leaking: a full preparation queue refuses at once, cancellation
// and deadlines reach requests still waiting for preparation or mid-stream and free every block, a
// slow client is cut off without blocking other streams, and shutdown ends running streams.
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/grpc_util.h"
#include "common/worker_call_trailer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lazyattn/v1/worker.grpc.pb.h"
#include "services/worker/server/worker_service.h"
#include "services/worker/server/worker_service_test_fixture.h"

namespace lazyattn {
namespace {

using ::testing::HasSubstr;
using testing::kDocs;
using testing::MetricValue;
using testing::StreamResult;
using testing::TextDoc;
using testing::WorkerServiceTest;

// Occupies every preparation thread until released (tasks submitted straight to the pool).
class PoolBlocker {
 public:
  explicit PoolBlocker(PrepPool& pool) {
    for (int i = 0; i < pool.options().threads; ++i) {
      EXPECT_TRUE(pool.Submit([this](const absl::Status&) {
                        started_.fetch_add(1);
                        release_.WaitForNotification();
                      }).ok());
    }
    while (started_.load() < pool.options().threads) absl::SleepFor(absl::Milliseconds(1));
  }
  ~PoolBlocker() { Release(); }
  void Release() {
    if (!release_.HasBeenNotified()) release_.Notify();
  }

 private:
  std::atomic<int> started_{0};
  absl::Notification release_;
};

// Sends `request` and expects it handed back before any token: UNAVAILABLE with the worker's
// trailer and the handed-back mark, which a router moves to another worker at once.
void ExpectHandedBack(v1::Worker::Stub& stub, const v1::GenerateRequest& request) {
  grpc::ClientContext ctx;
  auto reader = stub.Generate(&ctx, request);
  v1::GenerateResponse m;
  int tokens = 0;
  while (reader->Read(&m)) tokens += m.has_token() ? 1 : 0;
  const grpc::Status s = reader->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  EXPECT_EQ(tokens, 0);
  const auto& trailers = ctx.GetServerTrailingMetadata();
  EXPECT_EQ(trailers.count(kWorkerEndedCallKey), 1u);
  EXPECT_EQ(trailers.count(kWorkerHandedBackKey), 1u) << "not marked as handed back";
}

TEST_F(WorkerServiceTest, AFullPreparationQueueIsResourceExhaustedAtOnce) {
  StartServer(/*slow=*/false, 4, 1024, {.threads = 1, .max_pending = 1});
  PrepPool& pool = server_->service().prep_pool();
  PoolBlocker blocker(pool);
  // One request waits in the queue ...
  grpc::ClientContext queued_ctx;
  auto queued = stub_->Generate(&queued_ctx, Request(kDocs, 2));
  const absl::Time until = absl::Now() + absl::Seconds(10);
  while (pool.pending() < 1 && absl::Now() < until) absl::SleepFor(absl::Milliseconds(1));
  ASSERT_EQ(pool.pending(), 1);
  // ... so the next is refused without waiting.
  const StreamResult refused = Generate(Request(kDocs, 2));
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(refused.status.error_message(), HasSubstr("engine.max_pending_preparations 1"));
  {
    v1::PrefetchRequest p;
    *p.add_documents() = TextDoc(kDocs[0]);
    grpc::ClientContext ctx;
    v1::PrefetchResponse resp;
    EXPECT_EQ(stub_->Prefetch(&ctx, p, &resp).error_code(),
              grpc::StatusCode::RESOURCE_EXHAUSTED);
  }
  EXPECT_EQ(Requests("resource_exhausted"), 1);
  // Once the pool frees up, the queued request is served.
  blocker.Release();
  v1::GenerateResponse m;
  int tokens = 0;
  while (queued->Read(&m)) tokens += m.has_token() ? 1 : 0;
  EXPECT_TRUE(queued->Finish().ok());
  EXPECT_EQ(tokens, 2);
  EXPECT_TRUE(Generate(Request(kDocs, 2)).status.ok());
  ExpectIdle();
}

// A drain hands back a request still waiting for tokenization as it does one waiting for
// admission: UNAVAILABLE with the worker's trailer and the handed-back mark, at once.
TEST_F(WorkerServiceTest, ADrainHandsBackARequestWaitingForPreparation) {
  StartServer(/*slow=*/false, 4, 1024, {.threads = 1, .max_pending = 4});
  PrepPool& pool = server_->service().prep_pool();
  PoolBlocker blocker(pool);
  grpc::ClientContext ctx;
  auto reader = stub_->Generate(&ctx, Request(kDocs, 2));
  const absl::Time until = absl::Now() + absl::Seconds(10);
  while (pool.pending() < 1 && absl::Now() < until) absl::SleepFor(absl::Milliseconds(1));
  ASSERT_EQ(pool.pending(), 1);
  std::thread drainer([&] { server_->Drain(); });
  v1::GenerateResponse m;
  int tokens = 0;
  while (reader->Read(&m)) tokens += m.has_token() ? 1 : 0;
  const grpc::Status s = reader->Finish();
  blocker.Release();  // the pool's thread, which the drain's stop of the pool joins
  drainer.join();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  EXPECT_EQ(tokens, 0);
  const auto& trailers = ctx.GetServerTrailingMetadata();
  EXPECT_EQ(trailers.count(kWorkerEndedCallKey), 1u);
  EXPECT_EQ(trailers.count(kWorkerHandedBackKey), 1u) << "not marked as handed back";
}

// A drain is announced before the port closes (server.drain_announce_ms): health answers
// NOT_SERVING, which a router's probe ejects on at once and a load balancer reads, and a call
// arriving meanwhile is handed back; only then does gRPC refuse calls at the connection. Without
// the announcement a probe found the port closed at once and never saw NOT_SERVING.
TEST_F(WorkerServiceTest, ADrainAnswersNotServingAndHandsBackNewCallsBeforeThePortCloses) {
  drain_announce_ = absl::Seconds(3);
  StartServer(/*slow=*/false);
  const absl::StatusOr<bool> before = CheckGrpcHealth(channel_, "", absl::Seconds(5));
  ASSERT_TRUE(before.ok() && *before) << "not SERVING before the drain";
  const absl::Time start = absl::Now();
  std::thread drainer([&] { server_->Drain(); });
  absl::StatusOr<bool> serving = true;
  while (serving.ok() && *serving && absl::Now() - start < absl::Seconds(2)) {
    serving = CheckGrpcHealth(channel_, "", absl::Seconds(1));
  }
  ASSERT_TRUE(serving.ok()) << "the port closed before NOT_SERVING was seen: " << serving.status();
  EXPECT_FALSE(*serving);
  ExpectHandedBack(*stub_, Request(kDocs, 2));  // not refused at the connection
  EXPECT_LT(absl::Now() - start, absl::Seconds(3)) << "the checks above ran after the window";
  drainer.join();
  EXPECT_GE(absl::Now() - start, absl::Seconds(3));
  const absl::StatusOr<bool> after = CheckGrpcHealth(channel_, "", absl::Seconds(1));
  EXPECT_FALSE(after.ok()) << "the port still answers after the drain";
}

// A drain stops preparation before gRPC stops taking calls: a request arriving in between is
// handed back at once, never queued and never lost.
TEST_F(WorkerServiceTest, ARequestArrivingOncePreparationStoppedIsHandedBack) {
  StartServer(/*slow=*/false, 4, 1024, {.threads = 1, .max_pending = 4});
  server_->service().StopPreparation();
  ExpectHandedBack(*stub_, Request(kDocs, 2));
  EXPECT_EQ(server_->service().in_flight(), 0u);
}

TEST_F(WorkerServiceTest, CancellationAndDeadlinesReachARequestWaitingForPreparation) {
  StartServer(/*slow=*/false, 4, 1024, {.threads = 1, .max_pending = 4});
  PrepPool& pool = server_->service().prep_pool();
  PoolBlocker blocker(pool);
  {
    // The deadline passes while the request is queued: it ends without a pool thread.
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
    auto reader = stub_->Generate(&ctx, Request(kDocs, 2));
    v1::GenerateResponse m;
    EXPECT_FALSE(reader->Read(&m));
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  }
  {
    // The client's deadline fires a little before the worker's (which counts from arrival): wait
    // until the worker has taken the expired call out of the queue, so that the queued call seen
    // below is the next one. (Without this wait the next call was sometimes cancelled before it
    // reached the worker at all, which then rightly never counted it.)
    const absl::Time until = absl::Now() + absl::Seconds(10);
    while (pool.pending() > 0 && absl::Now() < until) absl::SleepFor(absl::Milliseconds(1));
    ASSERT_EQ(pool.pending(), 0);
  }
  {
    grpc::ClientContext ctx;
    auto reader = stub_->Generate(&ctx, Request(kDocs, 2));
    const absl::Time until = absl::Now() + absl::Seconds(10);
    while (pool.pending() < 1 && absl::Now() < until) absl::SleepFor(absl::Milliseconds(1));
    ASSERT_EQ(pool.pending(), 1);
    ctx.TryCancel();
    v1::GenerateResponse m;
    EXPECT_FALSE(reader->Read(&m));
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  // Both left the queue while its only thread was still busy.
  const absl::Time until = absl::Now() + absl::Seconds(10);
  while (pool.pending() > 0 && absl::Now() < until) absl::SleepFor(absl::Milliseconds(1));
  EXPECT_EQ(pool.pending(), 0);
  EXPECT_EQ(pool.running(), 1);  // the blocker
  while (Requests("cancelled") + Requests("deadline_exceeded") < 2 && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_EQ(Requests("deadline_exceeded"), 1);
  EXPECT_EQ(Requests("cancelled"), 1);
  blocker.Release();
  EXPECT_TRUE(Generate(Request(kDocs, 2)).status.ok());
  ExpectIdle();
  // Neither reached the engine nor was tokenized: only the last request was.
  const EngineStats stats = server_->engine().stats();
  EXPECT_EQ(stats.requests_ok, 1);
  EXPECT_EQ(stats.requests_failed, 0);
  EXPECT_EQ(stats.text_docs_tokenized, 3);
}

TEST_F(WorkerServiceTest, ClientCancellationMidStreamFreesEveryBlock) {
  StartServer(/*slow=*/true);
  grpc::ClientContext ctx;
  auto reader = stub_->Generate(&ctx, Request(kDocs, 3000));
  v1::GenerateResponse m;
  int tokens = 0;
  while (tokens < 2 && reader->Read(&m)) tokens += m.has_token() ? 1 : 0;
  ASSERT_EQ(tokens, 2);
  EXPECT_GT(Status().referenced_blocks(), 0);  // the request holds its KV while it runs
  ctx.TryCancel();
  while (reader->Read(&m)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  ExpectIdle();
  EXPECT_EQ(Requests("cancelled"), 1);  // ended by the cancellation, not by finishing
  EXPECT_EQ(Requests("ok"), 0);
}

TEST_F(WorkerServiceTest, ASlowClientIsCutOffWithoutBlockingOtherStreams) {
  StartServer(/*slow=*/false, /*max_documents=*/4, /*max_buffered_tokens=*/16);
  // A client that announces a tiny receive window and does not read: the worker's writes stall,
  // generated tokens pile up in the call's queue, and the call is cut off at 16.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 1024);
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  auto slow_channel = grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", server_->port()),
                                                grpc::InsecureChannelCredentials(), args);
  auto slow_stub = v1::Worker::NewStub(slow_channel);
  grpc::ClientContext ctx;
  auto reader = slow_stub->Generate(&ctx, Request(kDocs, 3500));
  // Meanwhile another client is served normally.
  const StreamResult other = Generate(Request(kDocs, 8));
  EXPECT_TRUE(other.status.ok()) << other.status.error_message();
  const absl::Time until = absl::Now() + absl::Seconds(20);
  while (Requests("resource_exhausted") < 1 && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(Requests("resource_exhausted"), 1);
  v1::GenerateResponse m;
  int tokens = 0;
  while (reader->Read(&m)) tokens += m.has_token() ? 1 : 0;
  const grpc::Status s = reader->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(s.error_message(), HasSubstr("client too slow"));
  EXPECT_LT(tokens, 3500);
  ExpectIdle();
}

TEST_F(WorkerServiceTest, DeadlineEndsTheRequestAndFreesItsBlocks) {
  StartServer(/*slow=*/true);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(300));
  auto reader = stub_->Generate(&ctx, Request(kDocs, 3000));
  v1::GenerateResponse m;
  int tokens = 0;
  bool final = false;
  while (reader->Read(&m)) {
    tokens += m.has_token() ? 1 : 0;
    final = final || m.has_final();
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_FALSE(final);
  EXPECT_LT(tokens, 3000);
  ExpectIdle();
  EXPECT_EQ(Requests("deadline_exceeded"), 1);
}

TEST_F(WorkerServiceTest, ShutdownEndsRunningStreamsWithUnavailable) {
  StartServer(/*slow=*/true);
  grpc::ClientContext ctx;
  auto reader = stub_->Generate(&ctx, Request(kDocs, 3000));
  v1::GenerateResponse m;
  ASSERT_TRUE(reader->Read(&m));
  std::thread stopper([&] { server_->Shutdown(); });
  while (reader->Read(&m)) {
  }
  const grpc::Status s = reader->Finish();
  stopper.join();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(s.error_message(), HasSubstr("shutting down"));
  EXPECT_EQ(server_->service().in_flight(), 0u);
  EXPECT_TRUE(server_->engine().WaitIdleAndCheck().ok());
}

// A stream that outlives the drain timeout is ended by the worker itself: UNAVAILABLE "shutting
// down" with the worker's trailer (common/worker_call_trailer.h), so a router fails it over as a
// drain. gRPC's own cancellation at the deadline, as before, ended it without the trailer, which
// a router counts as a crashed worker (two such on one content quarantine it).
TEST_F(WorkerServiceTest, AStreamPastTheDrainTimeoutEndsAsADrainWithTheWorkersTrailer) {
  drain_timeout_ = absl::Milliseconds(300);
  StartServer(/*slow=*/true);
  grpc::ClientContext ctx;
  auto reader = stub_->Generate(&ctx, Request(kDocs, 3000));
  v1::GenerateResponse m;
  ASSERT_TRUE(reader->Read(&m));
  bool finished = true;
  std::thread drainer([&] { finished = server_->Drain(); });
  while (reader->Read(&m)) {
  }
  const grpc::Status s = reader->Finish();
  drainer.join();
  EXPECT_FALSE(finished);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("shutting down"));
  const auto& trailers = ctx.GetServerTrailingMetadata();
  const auto it = trailers.find(kWorkerEndedCallKey);
  ASSERT_NE(it, trailers.end()) << "ended without the worker's trailer";
  EXPECT_EQ(std::string(it->second.data(), it->second.size()), kWorkerEndedCallValue);
  EXPECT_EQ(trailers.count(kWorkerHandedBackKey), 0u) << "work was done for it: not handed back";
  EXPECT_EQ(server_->service().in_flight(), 0u);
  EXPECT_TRUE(server_->engine().WaitIdleAndCheck().ok());
}

// An operator's second stop signal cuts a drain short: EndDrainNow makes the Drain() in progress
// end the calls still running at once, as its timeout would (UNAVAILABLE "shutting down" with the
// worker's trailer, so a router fails them over as a drain), instead of letting them run for up to
// server.drain_timeout_s.
TEST_F(WorkerServiceTest, EndDrainNowEndsADrainInProgressAsItsTimeoutWould) {
  drain_timeout_ = absl::Seconds(600);
  // The second signal comes during the announcement (server.drain_announce_ms at its largest),
  // which it cuts short too: the bound below is a third of it.
  drain_announce_ = absl::Seconds(60);
  StartServer(/*slow=*/true);
  grpc::ClientContext ctx;
  auto reader = stub_->Generate(&ctx, Request(kDocs, 3000));
  v1::GenerateResponse m;
  ASSERT_TRUE(reader->Read(&m));
  int tokens = m.has_token() ? 1 : 0;
  bool finished = true;
  std::thread drainer([&] { finished = server_->Drain(); });
  // The drain has begun once the worker says it no longer serves.
  const absl::Time until = absl::Now() + absl::Seconds(10);
  while (MetricValue(*server_->registry(), "lazyattn_worker_serving", {}) != 0 &&
         absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_EQ(MetricValue(*server_->registry(), "lazyattn_worker_serving", {}), 0);
  const absl::Time cut = absl::Now();
  server_->EndDrainNow();
  while (reader->Read(&m)) tokens += m.has_token() ? 1 : 0;
  const grpc::Status s = reader->Finish();
  drainer.join();
  // Bounded, loosely for a loaded machine: the drain's own end is ten minutes away.
  EXPECT_LT(absl::Now() - cut, absl::Seconds(20));
  EXPECT_FALSE(finished);
  EXPECT_LT(tokens, 3000) << "the stream ran to its end: the drain was not cut short";
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("shutting down"));
  const auto& trailers = ctx.GetServerTrailingMetadata();
  const auto it = trailers.find(kWorkerEndedCallKey);
  ASSERT_NE(it, trailers.end()) << "ended without the worker's trailer";
  EXPECT_EQ(std::string(it->second.data(), it->second.size()), kWorkerEndedCallValue);
  EXPECT_EQ(server_->service().in_flight(), 0u);
  EXPECT_TRUE(server_->engine().WaitIdleAndCheck().ok());
}

// At the start of a drain, requests still waiting for admission (nothing sent to their client)
// are handed back at once: UNAVAILABLE "shutting down" with the worker's trailer and no token,
// which a router retries on another worker right away without counting a lost call. Kept, they
// waited for the running request, stretched the drain and could be cut by its timeout. The
// running request finishes normally.
TEST_F(WorkerServiceTest, ADrainHandsBackQueuedRequestsAtOnceAndFinishesTheRunningOne) {
  max_running_ = 1;
  // The running request must outlast the hand-back (milliseconds) and finish within the drain
  // timeout however slow the build: ~0.8 s on the slow model in Release, ~17 s under ASan.
  drain_timeout_ = absl::Seconds(600);
  StartServer(/*slow=*/true);
  constexpr int kRunningTokens = 400;
  grpc::ClientContext running_ctx;
  auto running = stub_->Generate(&running_ctx, Request(kDocs, kRunningTokens));
  v1::GenerateResponse first;
  ASSERT_TRUE(running->Read(&first));  // admitted: it holds the only running slot
  std::atomic<int> running_tokens{first.has_token() ? 1 : 0};
  std::atomic<bool> running_done{false};
  bool running_final = false;
  grpc::Status running_status;
  // Read on its own thread, so that flow control never slows it.
  std::thread running_reader([&] {
    v1::GenerateResponse m;
    while (running->Read(&m)) {
      running_tokens += m.has_token() ? 1 : 0;
      running_final = running_final || m.has_final();
    }
    running_status = running->Finish();
    running_done = true;
  });
  struct Queued {
    grpc::ClientContext ctx;
    int tokens = 0;
    grpc::Status status;
    std::thread reader;
  };
  std::vector<std::unique_ptr<Queued>> queued;
  for (int i = 0; i < 2; ++i) {
    queued.push_back(std::make_unique<Queued>());
    Queued* q = queued.back().get();
    q->reader = std::thread([this, q] {
      auto reader = stub_->Generate(&q->ctx, Request(kDocs, 4));
      v1::GenerateResponse m;
      while (reader->Read(&m)) q->tokens += m.has_token() ? 1 : 0;
      q->status = reader->Finish();
    });
  }
  const absl::Time until = absl::Now() + absl::Seconds(20);
  while (server_->engine().load().waiting < 2 && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_EQ(server_->engine().load().waiting, 2);  // both wait for admission in the engine
  bool finished = false;
  std::thread drainer([&] { finished = server_->Drain(); });
  for (auto& q : queued) q->reader.join();
  // Handed back while the running request still runs, not after it.
  EXPECT_FALSE(running_done.load()) << "the queued requests waited for the running one";
  for (auto& q : queued) {
    EXPECT_EQ(q->status.error_code(), grpc::StatusCode::UNAVAILABLE) << q->status.error_message();
    EXPECT_THAT(q->status.error_message(), HasSubstr("shutting down"));
    EXPECT_THAT(q->status.error_message(), HasSubstr("had not started"));
    EXPECT_EQ(q->tokens, 0);
    const auto& trailers = q->ctx.GetServerTrailingMetadata();
    const auto it = trailers.find(kWorkerEndedCallKey);
    ASSERT_NE(it, trailers.end()) << "ended without the worker's trailer";
    EXPECT_EQ(std::string(it->second.data(), it->second.size()), kWorkerEndedCallValue);
    // No work was done for it: a router may move it without drawing on its retry budget.
    EXPECT_EQ(trailers.count(kWorkerHandedBackKey), 1u) << "not marked as handed back";
  }
  running_reader.join();
  drainer.join();
  EXPECT_TRUE(running_status.ok()) << running_status.error_message();
  EXPECT_EQ(running_ctx.GetServerTrailingMetadata().count(kWorkerHandedBackKey), 0u)
      << "the running request was served, not handed back";
  EXPECT_EQ(running_tokens.load(), kRunningTokens);
  EXPECT_TRUE(running_final);
  EXPECT_TRUE(finished);
  EXPECT_EQ(Requests("unavailable"), 2);
  EXPECT_EQ(Requests("ok"), 1);
  EXPECT_EQ(server_->service().in_flight(), 0u);
  EXPECT_TRUE(server_->engine().WaitIdleAndCheck().ok());
}

}  // namespace
}  // namespace lazyattn
