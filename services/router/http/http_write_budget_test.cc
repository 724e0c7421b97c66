// The HTTP front against clients that read, but slowly, over real sockets (plain TCP and TLS) on
// 127.0.0.1: a stream's writes share http.write_wait_budget_ms of waiting on the client, past what
// their bytes earn at http.min_send_bytes_per_s, and an answer that is not streamed is bounded by
// its size at that rate instead. ConnectionStream's accounting alone: connection_stream_test.cc.
#include <gtest/gtest.h>

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/time/clock.h"
#include "services/router/http/http_stream_test_fixture.h"

namespace lazyattn::router {
namespace {

using testing::CompletionRequest;
using testing::kBound;
using testing::PacedWorker;
using testing::StreamClient;
using testing::WaitFor;

class HttpWriteBudgetTest : public testing::HttpStreamTest {
 protected:
  // ~7.2 MB of events read at 1 MB/s: the loopback buffers (a few MB) hold part of it, and the
  // router's writes wait ~3 s for the rest as long as it produces faster than the client reads
  // (it streams 3 MB/s or more here, a loaded CI machine included).
  static constexpr int kTokens = 6000;
  static constexpr double kReadRate = 1e6;  // bytes a second
  // Below the options' floor of 1 s, for a margin of 5 against the writes' waits.
  static constexpr absl::Duration kBudget = absl::Milliseconds(500);

  // A router on one connection thread whose worker sends `tokens` tokens of 1,000 bytes (about the
  // most a real token's text holds: worker_stream_check.h) as fast as the router takes them, then
  // ends; `tokens` 0: until it is cancelled.
  void StartBudgeted(absl::Duration budget, int64_t min_send_bytes_per_s, int tokens) {
    max_tokens_limit_ = 1 << 16;
    HttpOptions http;
    http.threads = 1;
    http.max_connections_per_client = 0;
    http.write_timeout = absl::Seconds(10);
    http.write_wait_budget = budget;
    http.min_send_bytes_per_s = min_send_bytes_per_s;
    ASSERT_NO_FATAL_FAILURE(Start(absl::ZeroDuration(), /*prefill_forever=*/false, http,
                                  std::string(1000, 'x'), tokens));
  }

  // Streams a kTokens answer to a client reading at kReadRate through a 64 KiB window. Whether
  // the client got the whole stream.
  bool StreamToASlowReader() {
    StreamClient client(http_->port(), tls(), /*receive_buffer=*/64 << 10);
    EXPECT_TRUE(client.connected());
    EXPECT_TRUE(client.Write(CompletionRequest(/*stream=*/true, /*max_tokens=*/1 << 16)));
    std::string received;
    const bool whole = client.ReadAtRateUntil(
        &received, kReadRate, [](const std::string& r) { return absl::StrContains(r, "[DONE]"); },
        absl::Seconds(30));
    if (whole) EXPECT_TRUE(absl::StrContains(received, R"("finish_reason":"length")"));
    return whole;
  }
};

// A client that keeps reading, but slower than the tokens come (at most 400 KB/s against tokens
// of 1,000 bytes sent as fast as the router takes them) and slower than the minimum rate (here 4
// MiB/s), makes each write wait inside the write timeout (a third of a few MiB of send buffer
// frees in a few seconds), so the timeout alone would let it hold the connection thread for the
// whole 65 MB answer (160 s). Its writes' waits add up, and past http.write_wait_budget_ms the
// stream is cut as a client's cancellation.
TEST_P(HttpWriteBudgetTest, AStreamToAClientReadingBelowTheMinimumRateIsCutAtItsBudget) {
  ASSERT_NO_FATAL_FAILURE(StartBudgeted(absl::Seconds(2), 4 << 20, /*tokens=*/0));
  PacedWorker& worker = *worker_;
  StreamClient slow(http_->port(), tls());
  ASSERT_TRUE(slow.connected());
  ASSERT_TRUE(slow.Write(CompletionRequest(/*stream=*/true, /*max_tokens=*/1 << 16)));
  ASSERT_TRUE(worker.WaitForTokens(1, kBound));
  // Slowly until the router ends the request (the client would see the close only after reading
  // the megabytes still in the sockets' buffers, at its own pace).
  const absl::Time started = absl::Now();
  std::string received;
  bool closed = false;
  while (!closed && RequestsEnded("cancelled") == 0 && absl::Now() - started < absl::Seconds(30)) {
    for (int i = 0; i < 2 && !closed; ++i) closed = !slow.Read(&received);  // up to 8 KiB
    received.clear();                                                       // only the pace matters
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_LT(absl::Now() - started, absl::Seconds(20)) << "not cut, or only near the end";
  EXPECT_TRUE(closed || slow.ReadToEnd(&received, kBound)) << "the connection stayed open";
  ExpectEndedByItsClient(worker);
  EXPECT_TRUE(WaitFor([&] { return http_->open_connections() == 0; }, kBound));
}

// A stream carrying a lot per token (alternatives, an echoed prompt) to a client that reads at
// 1 MB/s, above the minimum rate (256 KiB/s here), is not cut although its writes wait several
// times the budget: each byte sent earns more time than the client takes for it.
TEST_P(HttpWriteBudgetTest, AHeavyStreamToAClientReadingAboveTheMinimumRateIsNotCut) {
  ASSERT_NO_FATAL_FAILURE(StartBudgeted(kBudget, 256 << 10, kTokens));
  EXPECT_TRUE(StreamToASlowReader()) << "cut";
  EXPECT_TRUE(WaitFor([&] { return RequestsEnded("ok") == 1; }, kBound));
  EXPECT_EQ(RequestsEnded("cancelled"), 0);
}

// The same client when bytes earn nothing (min_send_bytes_per_s 0): its ~3 s of waits spend the
// budget, and the stream is cut (the worker may have sent every token by then).
TEST_P(HttpWriteBudgetTest, TheSameStreamIsCutWhenBytesEarnNoTime) {
  ASSERT_NO_FATAL_FAILURE(StartBudgeted(kBudget, 0, kTokens));
  EXPECT_FALSE(StreamToASlowReader()) << "not cut";
  EXPECT_TRUE(WaitFor([&] { return http_->open_connections() == 0; }, kBound));
  EXPECT_TRUE(WaitFor([&] { return http_->live_calls() == 0; }, kBound));
}

// An answer that is not streamed has a size: it must be sent within the write timeout plus its
// bytes at the minimum rate, and the wait budget, which its writes would spend several times over
// (6 MB read at 1 MB/s), does not apply to it.
TEST_P(HttpWriteBudgetTest, AnAnswerNotStreamedIsBoundByItsSizeNotTheBudget) {
  ASSERT_NO_FATAL_FAILURE(StartBudgeted(kBudget, 256 << 10, kTokens));
  StreamClient client(http_->port(), tls(), /*receive_buffer=*/64 << 10);
  ASSERT_TRUE(client.connected());
  ASSERT_TRUE(client.Write(CompletionRequest(/*stream=*/false, /*max_tokens=*/1 << 16)));
  // The whole answer: its head, then as many bytes as its Content-Length says.
  auto whole = [](const std::string& r) {
    const size_t head_end = r.find("\r\n\r\n");
    if (head_end == std::string::npos) return false;
    const size_t at = r.find("Content-Length: ");
    size_t length = 0;
    if (at == std::string::npos || at > head_end) return false;
    const size_t value = at + 16;
    if (!absl::SimpleAtoi(r.substr(value, r.find("\r\n", value) - value), &length)) return false;
    return r.size() >= head_end + 4 + length;
  };
  std::string received;
  const absl::Time start = absl::Now();
  ASSERT_TRUE(client.ReadAtRateUntil(&received, kReadRate, whole, absl::Seconds(30))) << "cut";
  EXPECT_GT(absl::Now() - start, absl::Seconds(2));  // as long as the stream's reading
  EXPECT_EQ(received.rfind("HTTP/1.1 200", 0), 0u) << received.substr(0, 200);
  EXPECT_TRUE(absl::StrContains(received, R"("finish_reason":"length")"));
  EXPECT_TRUE(WaitFor([&] { return RequestsEnded("ok") == 1; }, kBound));
}

INSTANTIATE_TEST_SUITE_P(Transports, HttpWriteBudgetTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "Tls" : "Plain";
                         });

}  // namespace
}  // namespace lazyattn::router
