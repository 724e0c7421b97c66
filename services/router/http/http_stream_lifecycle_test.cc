// How an HTTP request in flight ends when the router shuts down or its client hangs up, over real
// sockets (plain TCP and TLS) on 127.0.0.1, in front of a router whose worker streams tokens at a
// steady pace for as long as it is let: the call on the worker must be cancelled in both cases,
// and a stream cut by the shutdown must say why in its last event. Certificates come from
// tools/gen-certs (run from the source tree, as ctest does).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <openssl/ssl.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/worker_call_trailer.h"
#include "lazyattn/v1/worker.grpc.pb.h"
#include "services/router/http/http_server.h"
#include "services/router/server/fake_cluster_for_test.h"
#include "services/router/server/router_server.h"

namespace lazyattn::router {
namespace {

using testing::FakeKvdir;
using testing::WaitFor;
using testing::RouterOptionsForFakeKvdir;

// Sends `token_text` ("tok") every `interval` until the call is cancelled (or a million tokens,
// far beyond any test), or, held in prefill, sends nothing until then; counts the calls that saw
// their cancellation.
class PacedWorker final : public lazyattn::v1::Worker::Service {
 public:
  PacedWorker(absl::Duration interval, bool prefill_forever, std::string token_text = "tok")
      : interval_(interval), prefill_forever_(prefill_forever), token_text_(std::move(token_text)) {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(this);
    server_ = builder.BuildAndStart();
    address_ = absl::StrCat("127.0.0.1:", port);
  }
  ~PacedWorker() override {
    server_->Shutdown(std::chrono::system_clock::now());
    server_->Wait();
  }

  lazyattn::v1::WorkerStatus Status() const {
    lazyattn::v1::WorkerStatus s;
    s.set_worker_id("w0");
    s.set_address(address_);
    auto* m = s.mutable_model();
    m->set_name("fake-model");
    m->set_model_fingerprint(testing::kModelFp);
    m->set_tokenizer_fingerprint(testing::kTokenizerFp);
    m->set_vocab_size(1000);
    m->set_max_context_tokens(8192);
    m->set_max_documents(32);
    m->set_chat_template("smollm2");
    return s;
  }

  // Waits until `n` tokens were sent (over all calls).
  bool WaitForTokens(int n, absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto reached = [this, n]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return tokens_ >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&reached), timeout);
  }
  bool WaitForCalls(int n, absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto reached = [this, n]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return calls_ >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&reached), timeout);
  }
  // Waits until `n` calls saw their cancellation.
  bool WaitForCancellation(absl::Duration timeout, int n = 1) {
    absl::MutexLock lock(&mu_);
    auto seen = [this, n]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return cancellations_ >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&seen), timeout);
  }

  grpc::Status Generate(grpc::ServerContext* context, const lazyattn::v1::GenerateRequest*,
                        grpc::ServerWriter<lazyattn::v1::GenerateResponse>* writer) override {
    context->AddTrailingMetadata(kWorkerEndedCallKey, kWorkerEndedCallValue);
    {
      absl::MutexLock lock(&mu_);
      ++calls_;
    }
    for (int i = 0; i < 1000000; ++i) {
      if (prefill_forever_ || i > 0) absl::SleepFor(interval_);
      if (context->IsCancelled()) break;
      if (prefill_forever_) continue;
      lazyattn::v1::GenerateResponse r;
      r.mutable_token()->set_token_id(100);
      r.mutable_token()->set_text(token_text_);
      if (!writer->Write(r)) break;  // the router cancelled the call
      absl::MutexLock lock(&mu_);
      ++tokens_;
    }
    absl::MutexLock lock(&mu_);
    ++cancellations_;
    return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
  }
  grpc::Status Status(grpc::ServerContext*, const lazyattn::v1::WorkerStatusRequest*,
                      lazyattn::v1::WorkerStatus* response) override {
    *response = Status();
    return grpc::Status::OK;
  }

 private:
  const absl::Duration interval_;
  const bool prefill_forever_;
  const std::string token_text_;
  std::string address_;
  std::unique_ptr<grpc::Server> server_;
  absl::Mutex mu_;
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
  int tokens_ ABSL_GUARDED_BY(mu_) = 0;
  int cancellations_ ABSL_GUARDED_BY(mu_) = 0;
};

// One client connection, plain or TLS (the server's certificate is not verified).
class Client {
 public:
  Client(int port, bool tls) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    timeval tv{1, 0};  // Read() returns after at most this much silence
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    if (connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) return;
    if (!tls) {
      connected_ = true;
      return;
    }
    ctx_ = SSL_CTX_new(TLS_client_method());
    ssl_ = SSL_new(ctx_);
    SSL_set_fd(ssl_, fd_);
    connected_ = SSL_connect(ssl_) == 1;
  }
  ~Client() {
    Close();
    if (ssl_ != nullptr) SSL_free(ssl_);
    if (ctx_ != nullptr) SSL_CTX_free(ctx_);
  }

  bool connected() const { return connected_; }
  bool Write(const std::string& data) {
    if (!connected_) return false;
    const int n = static_cast<int>(data.size());
    if (ssl_ != nullptr) return SSL_write(ssl_, data.data(), n) == n;
    return write(fd_, data.data(), data.size()) == static_cast<ssize_t>(data.size());
  }
  // Appends what arrives within a second; false once the server closed the connection.
  bool Read(std::string* out) {
    char buf[4096];
    const ssize_t n =
        ssl_ != nullptr ? SSL_read(ssl_, buf, sizeof(buf)) : read(fd_, buf, sizeof(buf));
    if (n > 0) {
      out->append(buf, static_cast<size_t>(n));
      return true;
    }
    if (ssl_ != nullptr) {
      const int e = SSL_get_error(ssl_, static_cast<int>(n));
      return e == SSL_ERROR_WANT_READ ||
             (e == SSL_ERROR_SYSCALL && (errno == EAGAIN || errno == EWOULDBLOCK));
    }
    return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR);
  }
  // Reads until the server closes the connection; false if `limit` passes first.
  bool ReadToEnd(std::string* out, absl::Duration limit) {
    const absl::Time deadline = absl::Now() + limit;
    while (absl::Now() < deadline) {
      if (!Read(out)) return true;
    }
    return false;
  }
  // Reads until `done(received)` or the server closes or `limit` passes; whether done.
  bool ReadUntil(std::string* out, const std::function<bool(const std::string&)>& done,
                 absl::Duration limit) {
    const absl::Time deadline = absl::Now() + limit;
    while (!done(*out) && absl::Now() < deadline) {
      if (!Read(out)) break;
    }
    return done(*out);
  }
  // Hangs up as a client that gives up does; over TLS with its close_notify, bytes the server
  // finds in front of the FIN.
  void Close() {
    if (fd_ < 0) return;
    if (ssl_ != nullptr && connected_) SSL_shutdown(ssl_);
    close(fd_);
    fd_ = -1;
  }

 private:
  SSL_CTX* ctx_ = nullptr;
  SSL* ssl_ = nullptr;
  int fd_ = -1;
  bool connected_ = false;
};

// Keep-alive, as SDK clients are: the server decides when the connection closes.
// `choices`: OpenAI's `n`.
std::string CompletionRequest(bool stream, int max_tokens = 4000, int choices = 1) {
  const std::string body = absl::StrCat(
      R"({"messages": [{"role": "user", "content": "Hi?"}], "max_tokens": )", max_tokens,
      R"(, "stream": )", stream ? "true" : "false", R"(, "n": )", choices, "}");
  return absl::StrCat(
      "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
      "Content-Length: ",
      body.size(), "\r\n\r\n", body);
}

int Count(const std::string& haystack, const std::string& needle) {
  int n = 0;
  for (size_t at = haystack.find(needle); at != std::string::npos;
       at = haystack.find(needle, at + needle.size())) {
    ++n;
  }
  return n;
}

// Everything here waits on events; the bounds are generous for a loaded machine. The behaviour
// they guard is a worker call that runs on for the whole stream (here: ~1000 s) or not at all.
constexpr absl::Duration kBound = absl::Seconds(10);
// The drain grace before the shutdown cuts what is left (5 s in the router; shorter here).
constexpr absl::Duration kGrace = absl::Seconds(1);

class HttpStreamLifecycleTest : public ::testing::TestWithParam<bool> {
 protected:
  bool tls() const { return GetParam(); }

  void TearDown() override {
    if (http_ != nullptr) http_->Shutdown();
    http_.reset();
    if (!certs_.empty()) std::filesystem::remove_all(certs_);
  }

  // The router and its HTTP listener (`http`, but for its address and keep-alive) in front of a
  // PacedWorker (worker_).
  void Start(absl::Duration interval, bool prefill_forever, HttpOptions http = HttpOptions(),
             std::string token_text = "tok") {
    worker_ = std::make_unique<PacedWorker>(interval, prefill_forever, std::move(token_text));
    kvdir_.Start();
    kvdir_.SetWorkers({worker_->Status()});
    RouterOptions o = RouterOptionsForFakeKvdir(kvdir_.address());
    o.routing.token_idle_timeout = token_idle_timeout_;
    if (max_tokens_limit_ > 0) o.limits.max_tokens = max_tokens_limit_;
    auto server = RouterServer::Create(o, registry_);
    ASSERT_TRUE(server.ok()) << server.status();
    router_ = std::move(*server);

    TlsOptions tls_options;
    if (tls()) {
      certs_ = absl::StrCat(::testing::TempDir(), "/http-lifecycle-certs-", getpid());
      ASSERT_EQ(std::system(absl::StrCat("tools/gen-certs --out '", certs_,
                                         "' --workers 1 --force >/dev/null")
                                .c_str()),
                0)
          << "tools/gen-certs (run from the source tree) failed";
      tls_options.cert_file = certs_ + "/router-0.crt";
      tls_options.key_file = certs_ + "/router-0.key";
    }
    http.listen = "127.0.0.1:0";
    // Far beyond the bounds below: a connection the server keeps open is not mistaken for one it
    // closed.
    http.keep_alive_timeout = absl::Seconds(60);
    auto started = HttpServer::Create(http, tls_options, &router_->context(), nullptr);
    ASSERT_TRUE(started.ok()) << started.status();
    http_ = std::move(*started);
    ASSERT_EQ(http_->tls(), tls());
  }

  // The one request so far ended as the client's cancellation: its worker calls (one per choice)
  // cancelled, counted as `cancelled` (not against the worker), and no call left live.
  void ExpectEndedByItsClient(PacedWorker& worker, int choices = 1) {
    EXPECT_TRUE(worker.WaitForCancellation(kBound, choices)) << "a worker call was not cancelled";
    EXPECT_TRUE(WaitFor([&] { return RequestsEnded("cancelled") == choices; }, kBound))
        << RequestsEnded("cancelled");
    EXPECT_TRUE(WaitFor([&] { return http_->live_calls() == 0; }, kBound));
  }

  // Requests the router ended with `status` (a gRPC status name in lower case).
  int RequestsEnded(const std::string& status) const {
    return CounterSum("lazyattn_router_requests_total", absl::StrCat("status=\"", status, "\""));
  }

  // The sum of the router's `name` series whose labels hold `label`.
  int CounterSum(const std::string& name, const std::string& label = "") const {
    std::istringstream text(prometheus::TextSerializer().Serialize(registry_->Collect()));
    int total = 0;
    for (std::string line; std::getline(text, line);) {
      if (absl::StartsWith(line, name + "{") && absl::StrContains(line, label)) {
        total += static_cast<int>(std::stod(line.substr(line.rfind(' ') + 1)));
      }
    }
    return total;
  }

  // routing.token_idle_timeout for the router Start creates.
  absl::Duration token_idle_timeout_ = RoutingOptions().token_idle_timeout;
  int max_tokens_limit_ = 0;  // > 0: the router's limits.max_tokens

  std::shared_ptr<prometheus::Registry> registry_ = std::make_shared<prometheus::Registry>();
  std::unique_ptr<PacedWorker> worker_;  // outlives the router
  FakeKvdir kvdir_;
  std::unique_ptr<RouterServer> router_;
  std::unique_ptr<HttpServer> http_;  // shut down before the router
  std::string certs_;
};

TEST_P(HttpStreamLifecycleTest, ShutdownEndsAStreamStillGettingTokensAfterTheGrace) {
  ASSERT_NO_FATAL_FAILURE(Start(absl::Milliseconds(5), /*prefill_forever=*/false));
  PacedWorker& worker = *worker_;
  Client client(http_->port(), tls());
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
}

// A draining router cuts a stream of several choices (OpenAI's `n`) as it cuts one: the error
// event last, no [DONE], and every choice's worker call cancelled.
TEST_P(HttpStreamLifecycleTest, ShutdownEndsAStreamOfSeveralChoicesAndCancelsEveryOne) {
  ASSERT_NO_FATAL_FAILURE(Start(absl::Milliseconds(5), /*prefill_forever=*/false));
  PacedWorker& worker = *worker_;
  Client client(http_->port(), tls());
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
  Client client(http_->port(), tls());
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
    Client client(http_->port(), tls());
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
    Client client(http_->port(), tls());
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
    Client client(http_->port(), tls());
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
    Client client(http_->port(), tls());
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
    Client client(http_->port(), tls());
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
  Client stalled(http_->port(), tls());
  ASSERT_TRUE(stalled.connected());
  ASSERT_TRUE(stalled.Write(CompletionRequest(/*stream=*/true, /*max_tokens=*/1 << 16)));
  ASSERT_TRUE(worker.WaitForTokens(1, kBound));

  ExpectEndedByItsClient(worker);
  EXPECT_EQ(CounterSum("lazyattn_router_token_idle_timeouts_total"), 0);
  EXPECT_TRUE(WaitFor([&] { return http_->open_connections() == 0; }, kBound))
      << "the stalled connection still holds its thread";
  // The only thread serves the next request, and the worker is still live (the stall was not
  // counted against it).
  Client next(http_->port(), tls());
  ASSERT_TRUE(next.connected());
  ASSERT_TRUE(next.Write("GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"));
  std::string reply;
  EXPECT_TRUE(next.ReadToEnd(&reply, kBound)) << reply;
  EXPECT_EQ(reply.rfind("HTTP/1.1 200", 0), 0u) << reply;
  EXPECT_NE(reply.find(R"("workers":1)"), std::string::npos) << reply;
}

// A client that keeps reading, but slower than the tokens come (at most 400 KB/s against tokens
// of 1,000 bytes sent as fast as the router takes them), makes each write wait inside the write
// timeout (a third of a few MiB of send buffer frees in a few seconds), so the timeout alone
// would let it hold the connection thread for the whole 65 MB answer (160 s). Its writes' waits
// add up, and past http.write_wait_budget_ms the stream is cut as a client's cancellation.
TEST_P(HttpStreamLifecycleTest, AStreamToAClientThatReadsTooSlowlyIsCutAtItsWriteWaitBudget) {
  max_tokens_limit_ = 1 << 16;
  HttpOptions http;
  http.threads = 1;
  http.max_connections_per_client = 0;
  http.write_timeout = absl::Seconds(10);
  http.write_wait_budget = absl::Seconds(2);
  ASSERT_NO_FATAL_FAILURE(
      Start(absl::ZeroDuration(), /*prefill_forever=*/false, http, std::string(1000, 'x')));
  PacedWorker& worker = *worker_;
  Client slow(http_->port(), tls());
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

INSTANTIATE_TEST_SUITE_P(Transports, HttpStreamLifecycleTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "Tls" : "Plain";
                         });

}  // namespace
}  // namespace lazyattn::router
