// How an HTTP request in flight ends when the router shuts down or its client hangs up, over real
// sockets (plain TCP and TLS) on 127.0.0.1, in front of a router whose worker streams tokens at a
// steady pace for as long as it is let: the call on the worker must be cancelled in both cases,
// and a stream cut by the shutdown must say why in its last event. A client that stops reading
// is cut at the write timeout; one that reads too slowly, at its write wait budget
// (http_write_budget_test.cc).
#include <gtest/gtest.h>

#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/monotonic_time.h"
#include "services/router/http/http_stream_test_fixture.h"
#include "services/router/policy/outlier_detector.h"

namespace lazyattn::router {
namespace {

using testing::CompletionRequest;
using testing::Count;
using testing::kBound;
using testing::kGrace;
using testing::PacedWorker;
using testing::StreamClient;
using testing::WaitFor;

class HttpStreamLifecycleTest : public testing::HttpStreamTest {
 protected:
  // GET /health on a new connection: the whole reply ("" if none came).
  std::string Health() {
    StreamClient c(http_->port(), tls());
    std::string reply;
    if (c.connected() && c.Write("GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")) {
      c.ReadToEnd(&reply, kBound);
    }
    return reply;
  }
};

TEST_P(HttpStreamLifecycleTest, ShutdownEndsAStreamStillGettingTokensAfterTheGrace) {
  ASSERT_NO_FATAL_FAILURE(Start(absl::Milliseconds(5), /*prefill_forever=*/false));
  PacedWorker& worker = *worker_;
  StreamClient client(http_->port(), tls());
  ASSERT_TRUE(client.connected());
  ASSERT_TRUE(client.Write(CompletionRequest(/*stream=*/true)));
  std::string reply;
  ASSERT_TRUE(client.ReadUntil(
      &reply, [](const std::string& r) { return Count(r, "\"tok\"") >= 20; }, kBound))
      << reply;

  const absl::Time shutdown_began = absl::Now();
  std::thread shutdown([&] { http_->Shutdown(kGrace); });
  const int before_grace_end = Count(reply, "\"tok\"");
  // Read to the end of the stream; without the cut the stream would run ~1000 s.
  const bool closed = client.ReadToEnd(&reply, kGrace + kBound);
  const absl::Duration took = absl::Now() - shutdown_began;
  client.Close();  // lets the shutdown finish should the stream still run
  shutdown.join();

  // The stream's body ended (the last chunk), then the connection was closed, though the client
  // would have kept it.
  EXPECT_TRUE(closed) << "the connection was not closed " << kGrace + kBound
                      << " after the shutdown began; the stream's tail: "
                      << reply.substr(reply.size() - std::min<size_t>(reply.size(), 200));
  EXPECT_TRUE(absl::EndsWith(reply, "\r\n0\r\n\r\n"))
      << reply.substr(reply.size() - std::min<size_t>(reply.size(), 200));
  EXPECT_GE(took, kGrace);  // streams run on during the grace
  EXPECT_GT(Count(reply, "\"tok\""), before_grace_end);
  // Its last event says why, as OpenAI's error object; no [DONE].
  const size_t last_event = reply.rfind("data: ");
  ASSERT_NE(last_event, std::string::npos) << reply;
  const std::string tail = reply.substr(last_event);
  EXPECT_NE(tail.find(R"("error":{)"), std::string::npos) << tail;
  EXPECT_NE(tail.find("the router is shutting down"), std::string::npos) << tail;
  EXPECT_NE(tail.find(R"("code":"unavailable")"), std::string::npos) << tail;
  EXPECT_EQ(reply.find("[DONE]"), std::string::npos);
  EXPECT_TRUE(worker.WaitForCancellation(kBound)) << "the worker call was not cancelled";
  EXPECT_EQ(http_->live_calls(), 0);
  // Counted (and logged) as the shutdown's cut, not as a client that cancelled.
  EXPECT_TRUE(WaitFor([&] { return RequestsEnded("unavailable") == 1; }, kBound))
      << RequestsEnded("unavailable");
  EXPECT_EQ(RequestsEnded("cancelled"), 0);
}

// A draining router cuts a stream of several choices (OpenAI's `n`) as it cuts one: the error
// event last, no [DONE], and every choice's worker call cancelled.
TEST_P(HttpStreamLifecycleTest, ShutdownEndsAStreamOfSeveralChoicesAndCancelsEveryOne) {
  ASSERT_NO_FATAL_FAILURE(Start(absl::Milliseconds(5), /*prefill_forever=*/false));
  PacedWorker& worker = *worker_;
  StreamClient client(http_->port(), tls());
  ASSERT_TRUE(client.connected());
  ASSERT_TRUE(client.Write(CompletionRequest(/*stream=*/true, 4000, /*choices=*/3)));
  std::string reply;
  ASSERT_TRUE(client.ReadUntil(
      &reply, [](const std::string& r) { return Count(r, "\"tok\"") >= 30; }, kBound))
      << reply;
  std::thread shutdown([&] { http_->Shutdown(kGrace); });
  const bool closed = client.ReadToEnd(&reply, kGrace + kBound);
  client.Close();
  shutdown.join();
  EXPECT_TRUE(closed);
  const size_t last_event = reply.rfind("data: ");
  ASSERT_NE(last_event, std::string::npos) << reply;
  EXPECT_NE(reply.substr(last_event).find("the router is shutting down"), std::string::npos)
      << reply.substr(last_event);
  EXPECT_EQ(reply.find("[DONE]"), std::string::npos);
  EXPECT_TRUE(worker.WaitForCancellation(kBound, 3)) << "a choice's worker call ran on";
  EXPECT_EQ(http_->live_calls(), 0);
}

TEST_P(HttpStreamLifecycleTest, ShutdownAnswersANonStreamedRequest503AfterTheGrace) {
  ASSERT_NO_FATAL_FAILURE(Start(absl::Milliseconds(5), /*prefill_forever=*/false));
  PacedWorker& worker = *worker_;
  StreamClient client(http_->port(), tls());
  ASSERT_TRUE(client.connected());
  ASSERT_TRUE(client.Write(CompletionRequest(/*stream=*/false)));
  ASSERT_TRUE(worker.WaitForTokens(20, kBound));

  const absl::Time shutdown_began = absl::Now();
  std::thread shutdown([&] { http_->Shutdown(kGrace); });
  std::string reply;
  const bool closed = client.ReadToEnd(&reply, kGrace + kBound);
  const absl::Duration took = absl::Now() - shutdown_began;
  client.Close();
  shutdown.join();

  EXPECT_TRUE(closed) << reply;
  EXPECT_GE(took, kGrace);
  EXPECT_EQ(reply.rfind("HTTP/1.1 503", 0), 0u) << reply;
  EXPECT_NE(reply.find("the router is shutting down"), std::string::npos) << reply;
  // The request asked to keep the connection; the answer closes it and says only that (it
  // carried the library's Keep-Alive beside `Connection: close`).
  const std::string head = reply.substr(0, reply.find("\r\n\r\n"));
  EXPECT_NE(head.find("\r\nConnection: close"), std::string::npos) << head;
  EXPECT_EQ(head.find("Keep-Alive"), std::string::npos) << head;
  EXPECT_TRUE(worker.WaitForCancellation(kBound)) << "the worker call was not cancelled";
  EXPECT_EQ(http_->live_calls(), 0);
}

// The worker call of a client that hung up is cancelled, though nothing is written to the
// client before the end (a non-streamed request while tokens come; a stream in prefill), and it
// is counted as a client's cancellation.
TEST_P(HttpStreamLifecycleTest, AClientThatHangsUpCancelsItsNonStreamedCall) {
  ASSERT_NO_FATAL_FAILURE(Start(absl::Milliseconds(5), /*prefill_forever=*/false));
  PacedWorker& worker = *worker_;
  {
    StreamClient client(http_->port(), tls());
    ASSERT_TRUE(client.connected());
    ASSERT_TRUE(client.Write(CompletionRequest(/*stream=*/false)));
    ASSERT_TRUE(worker.WaitForTokens(20, kBound));
  }  // hangs up
  ExpectEndedByItsClient(worker);
}

TEST_P(HttpStreamLifecycleTest, AClientThatHangsUpCancelsItsStreamInPrefill) {
  ASSERT_NO_FATAL_FAILURE(Start(absl::Milliseconds(5), /*prefill_forever=*/true));
  PacedWorker& worker = *worker_;
  {
    StreamClient client(http_->port(), tls());
    ASSERT_TRUE(client.connected());
    ASSERT_TRUE(client.Write(CompletionRequest(/*stream=*/true)));
    ASSERT_TRUE(worker.WaitForCalls(1, kBound));
  }  // hangs up
  ExpectEndedByItsClient(worker);
}

// Mid-stream the hang-up is found by the next writes.
TEST_P(HttpStreamLifecycleTest, AClientThatHangsUpCancelsItsStreamMidTokens) {
  ASSERT_NO_FATAL_FAILURE(Start(absl::Milliseconds(5), /*prefill_forever=*/false));
  PacedWorker& worker = *worker_;
  {
    StreamClient client(http_->port(), tls());
    ASSERT_TRUE(client.connected());
    ASSERT_TRUE(client.Write(CompletionRequest(/*stream=*/true)));
    std::string reply;
    ASSERT_TRUE(client.ReadUntil(
        &reply, [](const std::string& r) { return Count(r, "\"tok\"") >= 20; }, kBound))
        << reply;
  }  // hangs up
  ExpectEndedByItsClient(worker);
}

// With several choices (OpenAI's `n`) every choice's worker call is cancelled, streamed or not.
TEST_P(HttpStreamLifecycleTest, AClientThatHangsUpCancelsEveryChoice) {
  ASSERT_NO_FATAL_FAILURE(Start(absl::Milliseconds(5), /*prefill_forever=*/false));
  PacedWorker& worker = *worker_;
  {
    StreamClient client(http_->port(), tls());
    ASSERT_TRUE(client.connected());
    ASSERT_TRUE(client.Write(CompletionRequest(/*stream=*/true, 4000, /*choices=*/3)));
    std::string reply;
    // Every choice streams: its tokens come in chunks naming its index.
    ASSERT_TRUE(client.ReadUntil(
        &reply,
        [](const std::string& r) {
          return Count(r, R"("index":0)") >= 5 && Count(r, R"("index":1)") >= 5 &&
                 Count(r, R"("index":2)") >= 5;
        },
        kBound))
        << reply;
  }  // hangs up
  ExpectEndedByItsClient(worker, 3);

  {
    StreamClient client(http_->port(), tls());
    ASSERT_TRUE(client.connected());
    ASSERT_TRUE(client.Write(CompletionRequest(/*stream=*/false, 4000, /*choices=*/2)));
    ASSERT_TRUE(worker.WaitForCalls(5, kBound));
    ASSERT_TRUE(worker.WaitForTokens(200, kBound));
  }  // hangs up
  EXPECT_TRUE(worker.WaitForCancellation(kBound, 5)) << "a worker call was not cancelled";
  EXPECT_TRUE(WaitFor([&] { return RequestsEnded("cancelled") == 5; }, kBound));
  EXPECT_TRUE(WaitFor([&] { return http_->live_calls() == 0; }, kBound));
}

// A client that sends a streaming request and then never reads: once the sockets' buffers are
// full no write makes progress, and within http.write_timeout_ms (twice that at most: the wait
// for room, then the send) the stream is cut, its worker call cancelled and counted as the
// client's cancellation, and the connection thread freed. The client stays connected throughout,
// so nothing but the write timeout can end the stream. Tokens of 1,000 bytes (about the most a
// real token's text holds: worker_stream_check.h), sent as fast as the router takes them, fill
// the buffers (a few MiB on loopback) within a second, long before max_tokens.
// The router's between-tokens timeout, shorter here than the write timeout, never fires for it:
// its clock runs only while the router waits on the worker, not on a client that stopped reading.
TEST_P(HttpStreamLifecycleTest, AStreamToAClientThatStopsReadingIsCutAtTheWriteTimeout) {
  token_idle_timeout_ = absl::Milliseconds(100);
  max_tokens_limit_ = 1 << 16;
  HttpOptions http;
  http.threads = 1;  // the stalled stream holds the only thread until it is cut
  http.max_connections_per_client = 0;
  http.write_timeout = absl::Milliseconds(500);
  ASSERT_NO_FATAL_FAILURE(
      Start(absl::ZeroDuration(), /*prefill_forever=*/false, http, std::string(1000, 'x')));
  PacedWorker& worker = *worker_;
  StreamClient stalled(http_->port(), tls());
  ASSERT_TRUE(stalled.connected());
  ASSERT_TRUE(stalled.Write(CompletionRequest(/*stream=*/true, /*max_tokens=*/1 << 16)));
  ASSERT_TRUE(worker.WaitForTokens(1, kBound));

  ExpectEndedByItsClient(worker);
  EXPECT_EQ(CounterSum("lazyattn_router_token_idle_timeouts_total"), 0);
  EXPECT_TRUE(WaitFor([&] { return http_->open_connections() == 0; }, kBound))
      << "the stalled connection still holds its thread";
  // The only thread serves the next request, and the worker is still live (the stall was not
  // counted against it).
  StreamClient next(http_->port(), tls());
  ASSERT_TRUE(next.connected());
  ASSERT_TRUE(next.Write("GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"));
  std::string reply;
  EXPECT_TRUE(next.ReadToEnd(&reply, kBound)) << reply;
  EXPECT_EQ(reply.rfind("HTTP/1.1 200", 0), 0u) << reply;
  EXPECT_NE(reply.find(R"("workers":1)"), std::string::npos) << reply;
}

// Clients that stall do not hold the shutdown past the grace for their timeouts
// (http.write_timeout_ms, http.body_timeout_ms: 30 s by default): a stream whose client stopped
// reading, its writer waiting for the socket, and a body that stopped arriving. Once the listener
// stops, every wait of a connection gives up within kWaitAfterStop.
TEST_P(HttpStreamLifecycleTest, ShutdownDoesNotWaitOutClientsThatStall) {
  max_tokens_limit_ = 1 << 16;
  ASSERT_NO_FATAL_FAILURE(Start(absl::ZeroDuration(), /*prefill_forever=*/false, HttpOptions(),
                                std::string(1000, 'x')));
  PacedWorker& worker = *worker_;
  StreamClient stalled(http_->port(), tls());
  ASSERT_TRUE(stalled.connected());
  ASSERT_TRUE(stalled.Write(CompletionRequest(/*stream=*/true, /*max_tokens=*/1 << 16)));
  StreamClient trickling(http_->port(), tls());
  ASSERT_TRUE(trickling.connected());
  ASSERT_TRUE(
      trickling.Write("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                      "application/json\r\nContent-Length: 100\r\n\r\n{\"mess"));
  ASSERT_TRUE(worker.WaitForTokens(1, kBound));
  // Tokens of 1,000 bytes as fast as the worker makes them: the socket buffers fill, and the
  // stream's writer then waits in poll for a client that never reads.
  int64_t written = -1;
  ASSERT_TRUE(WaitFor(
      [&] {
        const int64_t now = worker.tokens_sent();
        const bool still = now == written;
        written = now;
        if (!still) absl::SleepFor(absl::Milliseconds(200));
        return still;
      },
      kBound))
      << "the stream never waited for its client";

  const absl::Time began = absl::Now();
  http_->Shutdown(kGrace);
  const absl::Duration took = absl::Now() - began;
  // The grace, the cut's 250 ms slice, kWaitAfterStop, and room for a loaded machine: far below
  // the 30 s the stalled waits had left.
  EXPECT_LT(took, kGrace + absl::Seconds(5)) << took;
  EXPECT_TRUE(worker.WaitForCancellation(kBound)) << "the stalled stream's call ran on";
  EXPECT_EQ(http_->live_calls(), 0);
}

// A load balancer's readiness check: /health says 503 once the router drains (it refuses new
// requests then), while the stream in flight runs on through the grace.
TEST_P(HttpStreamLifecycleTest, HealthTurns503OnceTheRouterDrains) {
  ASSERT_NO_FATAL_FAILURE(Start(absl::Milliseconds(5), /*prefill_forever=*/false));
  std::string health = Health();
  EXPECT_EQ(health.rfind("HTTP/1.1 200", 0), 0u) << health;
  EXPECT_NE(health.find(R"("workers":1)"), std::string::npos) << health;

  StreamClient client(http_->port(), tls());
  ASSERT_TRUE(client.connected());
  ASSERT_TRUE(client.Write(CompletionRequest(/*stream=*/true)));
  ASSERT_TRUE(worker_->WaitForTokens(5, kBound));
  std::thread shutdown([&] { http_->Shutdown(kGrace); });
  // Within the grace (the stream keeps the router up until its end).
  EXPECT_TRUE(WaitFor(
      [&] {
        health = Health();
        return health.rfind("HTTP/1.1 503", 0) == 0;
      },
      kGrace / 2))
      << health;
  EXPECT_NE(health.find(R"("status":"shutting down")"), std::string::npos) << health;
  std::string reply;
  client.ReadToEnd(&reply, kGrace + kBound);
  client.Close();
  shutdown.join();
}

// A router whose every worker is ejected by health probing (a NOT_SERVING answer: all draining at
// once, a probe glitch) still routes, to all of them (the selector's panic mode): /health stays
// 200, so a glitch every router sees does not take them all out of the balancer, and says
// "degraded".
TEST_P(HttpStreamLifecycleTest, HealthSaysDegradedWhileEveryWorkerIsEjected) {
  ASSERT_NO_FATAL_FAILURE(Start(absl::Milliseconds(5), /*prefill_forever=*/false));
  std::string health = Health();
  EXPECT_EQ(health.rfind("HTTP/1.1 200", 0), 0u) << health;
  EXPECT_NE(health.find(R"({"admitted":1,"status":"ok","workers":1})"), std::string::npos)
      << health;
  // Ejected for the default base ejection (2 s), far longer than the check below.
  ASSERT_TRUE(router_->context().selector().outliers().Record(
      OutlierKey(worker_->Status().worker_id(), worker_->Status().address()),
      ProbeResult::kNotServing, MonotonicNow()));
  health = Health();
  EXPECT_EQ(health.rfind("HTTP/1.1 200", 0), 0u) << health;
  EXPECT_NE(health.find(R"({"admitted":0,"status":"degraded","workers":1})"), std::string::npos)
      << health;
}

INSTANTIATE_TEST_SUITE_P(Transports, HttpStreamLifecycleTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "Tls" : "Plain";
                         });

}  // namespace
}  // namespace lazyattn::router
