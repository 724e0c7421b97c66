// The pieces of the HTTP stream tests (http_stream_lifecycle_test.cc, http_write_budget_test.cc):
// a worker that streams tokens at a steady pace for as long as it is let, a raw client over plain
// TCP or TLS that reads at the test's pace, and a fixture running a router and its HTTP listener
// in front of that worker, parameterized on TLS. Certificates come from tools/gen-certs (run from
// the source tree, as ctest does).
#ifndef LAZYATTN_SERVICES_ROUTER_HTTP_HTTP_STREAM_TEST_FIXTURE_H_
#define LAZYATTN_SERVICES_ROUTER_HTTP_HTTP_STREAM_TEST_FIXTURE_H_

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <openssl/ssl.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
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

namespace lazyattn::router::testing {

// Sends `token_text` ("tok") every `interval` until the call is cancelled (or a million tokens,
// far beyond any test), or, held in prefill, sends nothing until then; counts the calls that saw
// their cancellation. With `final_after` > 0 a call ends after that many tokens instead, with a
// final message (finish reason "length").
class PacedWorker final : public lazyattn::v1::Worker::Service {
 public:
  PacedWorker(absl::Duration interval, bool prefill_forever, std::string token_text = "tok",
              int final_after = 0)
      : interval_(interval),
        prefill_forever_(prefill_forever),
        token_text_(std::move(token_text)),
        final_after_(final_after) {
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

  // Tokens sent so far (over all calls).
  int tokens_sent() {
    absl::MutexLock lock(&mu_);
    return tokens_;
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
      if (final_after_ > 0 && i == final_after_) return SendFinal(writer, i);
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
  grpc::Status SendFinal(grpc::ServerWriter<lazyattn::v1::GenerateResponse>* writer, int tokens) {
    lazyattn::v1::GenerateResponse last;
    lazyattn::v1::Final* final = last.mutable_final();
    final->set_finish_reason("length");
    std::string text;
    for (int i = 0; i < tokens; ++i) text += token_text_;
    final->set_text(text);
    final->mutable_usage()->set_completion_tokens(tokens);
    writer->Write(last);
    return grpc::Status::OK;
  }

  const absl::Duration interval_;
  const bool prefill_forever_;
  const std::string token_text_;
  const int final_after_;
  std::string address_;
  std::unique_ptr<grpc::Server> server_;
  absl::Mutex mu_;
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
  int tokens_ ABSL_GUARDED_BY(mu_) = 0;
  int cancellations_ ABSL_GUARDED_BY(mu_) = 0;
};

// One client connection, plain or TLS (the server's certificate is not verified).
class StreamClient {
 public:
  // `receive_buffer` > 0: the socket's receive buffer, set before connecting (it then bounds the
  // TCP window and is not grown by the kernel), so that the bytes a slow reader leaves in flight
  // are few and the server's writes wait on its reading.
  StreamClient(int port, bool tls, int receive_buffer = 0) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    if (receive_buffer > 0) {
      setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &receive_buffer, sizeof(receive_buffer));
    }
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
  ~StreamClient() {
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
  // Reads at no more than `bytes_per_s` until `done(received)`, the server closes or `limit`
  // passes; whether done. Each read takes up to 4 KiB, then sleeps off what it took early.
  bool ReadAtRateUntil(std::string* out, double bytes_per_s,
                       const std::function<bool(const std::string&)>& done,
                       absl::Duration limit) {
    const absl::Time start = absl::Now();
    size_t taken = 0;
    while (!done(*out) && absl::Now() - start < limit) {
      const size_t before = out->size();
      if (!Read(out)) break;
      taken += out->size() - before;
      const absl::Time due = start + absl::Seconds(static_cast<double>(taken) / bytes_per_s);
      if (due > absl::Now()) absl::SleepFor(due - absl::Now());
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
inline std::string CompletionRequest(bool stream, int max_tokens = 4000, int choices = 1) {
  const std::string body = absl::StrCat(
      R"({"messages": [{"role": "user", "content": "Hi?"}], "max_tokens": )", max_tokens,
      R"(, "stream": )", stream ? "true" : "false", R"(, "n": )", choices, "}");
  return absl::StrCat(
      "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
      "Content-Length: ",
      body.size(), "\r\n\r\n", body);
}

inline int Count(const std::string& haystack, const std::string& needle) {
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

class HttpStreamTest : public ::testing::TestWithParam<bool> {
 protected:
  bool tls() const { return GetParam(); }

  void TearDown() override {
    if (http_ != nullptr) http_->Shutdown();
    http_.reset();
    if (!certs_.empty()) std::filesystem::remove_all(certs_);
  }

  // The router and its HTTP listener (`http`, but for its address and keep-alive) in front of a
  // PacedWorker (worker_; `final_after` as its).
  void Start(absl::Duration interval, bool prefill_forever, HttpOptions http = HttpOptions(),
             std::string token_text = "tok", int final_after = 0) {
    worker_ = std::make_unique<PacedWorker>(interval, prefill_forever, std::move(token_text),
                                            final_after);
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

}  // namespace lazyattn::router::testing

#endif  // LAZYATTN_SERVICES_ROUTER_HTTP_HTTP_STREAM_TEST_FIXTURE_H_
