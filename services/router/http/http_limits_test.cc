// The HTTP listener's limits against hostile clients, over real sockets on 127.0.0.1 in front of a
// router with a fake worker: a chunked body over http.max_body_bytes, a Content-Length it cannot
// honour, a client that trickles its headers or its body or never finishes its TLS handshake, and
// one address opening more connections than its share. Clients of a second address bind 127.0.0.2
// (all of 127/8 is loopback on Linux).
#include <gtest/gtest.h>
#include <openssl/ssl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "services/router/http/http_server.h"
#include "services/router/http/raw_http_client_for_test.h"
#include "services/router/server/fake_cluster_for_test.h"
#include "services/router/server/router_server.h"

namespace lazyattn::router {
namespace {

using testing::Connect;
using testing::FakeKvdir;
using testing::FakeWorker;
using testing::ReadAll;
using testing::ReadHead;
using testing::ReadResponse;
using testing::RouterOptionsForFakeKvdir;
using testing::SendAll;
using testing::WaitFor;

constexpr char kOtherAddress[] = "127.0.0.2";

std::string Post(const std::string& extra_headers, const std::string& body = "") {
  return absl::StrCat(
      "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n",
      extra_headers, "\r\n", body);
}

// What the router sent back to a client that trickled its request, until it closed.
struct TrickleResult {
  std::string reply;
  bool closed = false;
  absl::Duration took;  // from the call to the close (or the read's end)
};

// Runs `trickle(stop)` on its own thread (it sends, a byte at a time, until `stop` or its end)
// while this one reads everything the router sends back; then closes `fd`.
TrickleResult ReadWhileTrickling(int fd,
                                 const std::function<void(const std::atomic<bool>&)>& trickle) {
  std::atomic<bool> stop{false};
  std::thread sender([&] { trickle(stop); });
  const absl::Time start = absl::Now();
  TrickleResult r;
  r.reply = ReadAll(fd, &r.closed);
  r.took = absl::Now() - start;
  stop = true;
  sender.join();
  close(fd);
  return r;
}

std::string Chunk(const std::string& data) {
  return absl::StrCat(absl::Hex(data.size()), "\r\n", data, "\r\n");
}

constexpr char kChatBody[] =
    R"({"messages": [{"role": "user", "content": "Hi?"}], "max_tokens": 8})";
constexpr char kModels[] = "GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";

class HttpLimitsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto server = StartOneWorkerRouter(worker_, kvdir_);
    ASSERT_TRUE(server.ok()) << server.status();
    router_ = std::move(*server);
  }

  void TearDown() override {
    http_.reset();
    if (!certs_.empty()) std::filesystem::remove_all(certs_);
  }

  // A throwaway CA and the router's certificate under a temporary certs_ (removed at TearDown).
  void MakeCertificates(const std::string& tag) {
    certs_ = absl::StrCat(::testing::TempDir(), "/", tag, getpid());
    ASSERT_EQ(std::system(absl::StrCat("tools/gen-certs --out '", certs_,
                                       "' --workers 1 --force >/dev/null")
                              .c_str()),
              0)
        << "tools/gen-certs (run from the source tree) failed";
  }

  void StartHttp(const HttpOptions& options, const TlsOptions& tls = TlsOptions{}) {
    auto http = HttpServer::Create(options, tls, &router_->context(), nullptr);
    ASSERT_TRUE(http.ok()) << http.status();
    http_ = std::move(*http);
  }

  // Per-operation read timeouts long enough that only the new limits can explain a close.
  static HttpOptions Options() {
    HttpOptions o;
    o.listen = "127.0.0.1:0";
    o.read_timeout = absl::Seconds(30);
    o.max_connections_per_client = 0;
    return o;
  }

  // Sends `request` on a new connection; the reply until the server closes.
  std::string Exchange(const std::string& request, bool* closed = nullptr,
                       const std::string& source = "") {
    const int fd = Connect(http_->port(), source);
    if (fd < 0) return "(no connection)";
    std::string reply = SendAll(fd, request) ? ReadAll(fd, closed) : "(send failed)";
    close(fd);
    return reply;
  }

  FakeWorker worker_{"w0"};
  FakeKvdir kvdir_;
  std::unique_ptr<RouterServer> router_;
  std::unique_ptr<HttpServer> http_;  // shut down before the router
  std::string certs_;
};

// A port in use is refused: cpp-httplib binds with SO_REUSEPORT by default, so a second router
// given the same http.listen started and took a share of the first one's connections.
TEST_F(HttpLimitsTest, APortInUseIsRefused) {
  StartHttp(Options());
  HttpOptions taken = Options();
  taken.listen = absl::StrCat("127.0.0.1:", http_->port());
  auto second = HttpServer::Create(taken, TlsOptions{}, &router_->context(), nullptr);
  ASSERT_FALSE(second.ok()) << "a second listener started on " << taken.listen;
  EXPECT_EQ(second.status().message(), "http.listen: cannot bind " + taken.listen);
}

TEST_F(HttpLimitsTest, ChunkedBodyOverTheLimitIsRefusedAfterTheLimitAndTheConnectionCut) {
  HttpOptions o = Options();
  o.max_body_bytes = 1 << 20;
  StartHttp(o);
  const int fd = Connect(http_->port());
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(SendAll(fd, Post("Transfer-Encoding: chunked\r\n")));
  // 64 MiB in 64 KiB chunks, until the server stops taking them.
  constexpr int64_t kTotal = int64_t{64} << 20;
  std::atomic<int64_t> sent{0};
  std::thread sender([&] {
    const std::string chunk = Chunk(std::string(64 << 10, ' '));
    while (sent.load() < kTotal) {
      if (!SendAll(fd, chunk)) return;
      sent += 64 << 10;
    }
    SendAll(fd, "0\r\n\r\n");
  });
  const std::string head = ReadHead(fd);
  const int64_t sent_at_reply = sent.load();
  bool closed = false;
  const std::string body = ReadAll(fd, &closed);
  sender.join();
  close(fd);

  EXPECT_EQ(head.rfind("HTTP/1.1 413", 0), 0u) << head;
  EXPECT_NE(head.find("Connection: close"), std::string::npos) << head;
  EXPECT_NE(body.find("body: larger than http.max_body_bytes (1048576 bytes)"), std::string::npos)
      << body;
  EXPECT_TRUE(closed);
  // Answered after about the limit (plus what the sockets' buffers hold), not after the body, and
  // the connection was cut before the body was all sent: the router never held it.
  EXPECT_LT(sent_at_reply, int64_t{32} << 20);
  EXPECT_LT(sent.load(), kTotal);
}

TEST_F(HttpLimitsTest, ChunkedAndPipelinedRequestsWithinTheLimitAreServed) {
  HttpOptions o = Options();
  o.max_body_bytes = 1 << 20;
  StartHttp(o);
  const std::string body = kChatBody;
  // Two requests in one write: the second waits, read ahead, while the first is answered.
  const std::string first =
      Post("Transfer-Encoding: chunked\r\n",
           absl::StrCat(Chunk(body.substr(0, 10)), Chunk(body.substr(10)), "0\r\n\r\n"));
  const std::string second =
      Post(absl::StrCat("Connection: close\r\nContent-Length: ", body.size(), "\r\n"), body);
  bool closed = false;
  const std::string reply = Exchange(first + second, &closed);
  EXPECT_EQ(reply.rfind("HTTP/1.1 200", 0), 0u) << reply;
  const size_t next = reply.find("HTTP/1.1 ", 1);
  ASSERT_NE(next, std::string::npos) << reply;
  EXPECT_EQ(reply.compare(next, 12, "HTTP/1.1 200"), 0) << reply;
  EXPECT_TRUE(closed);
}

TEST_F(HttpLimitsTest, ContentLengthOverTheLimitIsAnsweredAtOnce) {
  HttpOptions o = Options();
  o.max_body_bytes = 1 << 20;
  StartHttp(o);
  const int fd = Connect(http_->port());
  ASSERT_GE(fd, 0);
  // Announces 2 MiB and sends none of it: the 413 must not wait for the body (or the 30 s read
  // timeout; the client gives up after 10 s).
  ASSERT_TRUE(SendAll(fd, Post(absl::StrCat("Content-Length: ", 2 << 20, "\r\n"))));
  bool closed = false;
  const std::string reply = ReadAll(fd, &closed);
  close(fd);
  EXPECT_EQ(reply.rfind("HTTP/1.1 413", 0), 0u) << reply;
  EXPECT_NE(reply.find("http.max_body_bytes"), std::string::npos) << reply;
  EXPECT_TRUE(closed);
}

// `Expect: 100-continue` is answered before the body is sent: a body the router would refuse by
// its framing is refused there (413 for a length over the limit, 400 for two lengths), never
// invited with 100; an acceptable one is invited, then served.
TEST_F(HttpLimitsTest, ExpectContinueInvitesOnlyABodyTheRouterWouldRead) {
  HttpOptions o = Options();
  o.max_body_bytes = 1 << 20;
  StartHttp(o);
  struct Case {
    std::string headers;
    const char* status;
  };
  for (const Case& c : {Case{absl::StrCat("Content-Length: ", 2 << 20, "\r\n"), "HTTP/1.1 413"},
                        Case{"Content-Length: 5\r\nContent-Length: 6\r\n", "HTTP/1.1 400"}}) {
    const int fd = Connect(http_->port());
    ASSERT_GE(fd, 0);
    ASSERT_TRUE(SendAll(fd, Post(c.headers + "Expect: 100-continue\r\n")));
    bool closed = false;
    const std::string reply = ReadAll(fd, &closed);
    close(fd);
    EXPECT_EQ(reply.rfind(c.status, 0), 0u) << c.headers << reply;
    EXPECT_EQ(reply.find("100 Continue"), std::string::npos) << reply;
    EXPECT_TRUE(closed) << c.headers;
  }
  const std::string body = kChatBody;
  const int fd = Connect(http_->port());
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(SendAll(fd, Post(absl::StrCat("Content-Length: ", body.size(),
                                            "\r\nExpect: 100-continue\r\nConnection: close\r\n"))));
  EXPECT_EQ(ReadHead(fd).rfind("HTTP/1.1 100 Continue", 0), 0u);
  ASSERT_TRUE(SendAll(fd, body));
  const std::string reply = ReadAll(fd);
  close(fd);
  EXPECT_EQ(reply.rfind("HTTP/1.1 200", 0), 0u) << reply;
}

TEST_F(HttpLimitsTest, ABodyOfNoClearLengthIsRefusedUnread) {
  StartHttp(Options());
  const std::string body = kChatBody;
  struct Case {
    std::string headers;
    const char* status;
    const char* names;
  };
  for (const Case& c : std::vector<Case>{
           {"Content-Length: -5\r\n", "HTTP/1.1 400", "Content-Length"},
           {"Content-Length: 5abc\r\n", "HTTP/1.1 400", "Content-Length"},
           {"Content-Length: 5\r\nContent-Length: 6\r\n", "HTTP/1.1 400", "Content-Length"},
           {"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n", "HTTP/1.1 400",
            "Content-Length"},
           {"Transfer-Encoding: gzip, chunked\r\n", "HTTP/1.1 501", "Transfer-Encoding"},
           {"", "HTTP/1.1 411", "Content-Length"}}) {
    // The body that follows is never read: each refusal comes at once and ends the connection.
    const int fd = Connect(http_->port());
    ASSERT_GE(fd, 0);
    ASSERT_TRUE(SendAll(fd, Post(c.headers, body)));
    const std::string reply = ReadResponse(fd);
    close(fd);
    EXPECT_EQ(reply.rfind(c.status, 0), 0u) << c.headers << reply;
    EXPECT_NE(reply.find(c.names), std::string::npos) << c.headers << reply;
    EXPECT_NE(reply.find("\"error\""), std::string::npos) << reply;
    EXPECT_NE(reply.find("Connection: close"), std::string::npos) << reply;
  }
  // Any other path would have its body read by the library before its 404: refused unread.
  bool closed = false;
  const std::string reply =
      Exchange("POST /v1/other HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n", &closed);
  EXPECT_EQ(reply.rfind("HTTP/1.1 404", 0), 0u) << reply;
  EXPECT_TRUE(closed);
}

TEST_F(HttpLimitsTest, AClientTricklingItsHeadersIsClosedAtTheHeaderTimeout) {
  HttpOptions o = Options();
  o.header_timeout = absl::Milliseconds(500);
  StartHttp(o);
  const int fd = Connect(http_->port());
  ASSERT_GE(fd, 0);
  // A byte every 100 ms never lets the 30 s read timeout run out; only the header timeout ends it.
  const TrickleResult r = ReadWhileTrickling(fd, [fd](const std::atomic<bool>& stop) {
    const std::string head = "GET /v1/models HTTP/1.1\r\nX-Slow: ";
    for (size_t i = 0; !stop.load() && i < 300; ++i) {
      if (send(fd, i < head.size() ? &head[i] : "a", 1, MSG_NOSIGNAL) != 1) return;
      absl::SleepFor(absl::Milliseconds(100));
    }
  });
  EXPECT_TRUE(r.closed) << "still open after " << r.took;
  EXPECT_EQ(r.reply, "");  // closed without an answer, as nginx does
  EXPECT_GE(r.took, absl::Milliseconds(400));
}

// A body sent a byte every 100 ms never lets the 30 s read timeout run out; only the body's own
// deadline from the end of the headers ends it: 408 naming the key, then the connection closed.
// Both framings, as the chunked one is read by other code in the library.
TEST_F(HttpLimitsTest, AClientTricklingItsBodyIsAnswered408AtTheBodyTimeout) {
  HttpOptions o = Options();
  o.body_timeout = absl::Milliseconds(500);
  StartHttp(o);
  const std::string body = kChatBody;  // ~70 bytes: ~7 s at this pace
  for (const bool chunked : {false, true}) {
    SCOPED_TRACE(chunked ? "chunked" : "Content-Length");
    const int fd = Connect(http_->port());
    ASSERT_GE(fd, 0);
    ASSERT_TRUE(SendAll(fd, Post(chunked ? std::string("Transfer-Encoding: chunked\r\n")
                                         : absl::StrCat("Content-Length: ", body.size(), "\r\n"))));
    const TrickleResult r = ReadWhileTrickling(fd, [&](const std::atomic<bool>& stop) {
      for (size_t i = 0; !stop.load() && i < body.size(); ++i) {
        const std::string piece = body.substr(i, 1);
        if (!SendAll(fd, chunked ? Chunk(piece) : piece)) return;
        absl::SleepFor(absl::Milliseconds(100));
      }
      if (chunked) SendAll(fd, "0\r\n\r\n");
    });
    EXPECT_EQ(r.reply.rfind("HTTP/1.1 408", 0), 0u) << r.reply << " after " << r.took;
    EXPECT_NE(r.reply.find("Connection: close"), std::string::npos) << r.reply;
    EXPECT_NE(r.reply.find(R"("param":"body")"), std::string::npos) << r.reply;
    EXPECT_NE(r.reply.find("http.body_timeout_ms (500 ms)"), std::string::npos) << r.reply;
    EXPECT_TRUE(r.closed) << "still open after " << r.took;
    EXPECT_GE(r.took, absl::Milliseconds(400));
  }
  // A body that comes at once is served as before.
  const std::string reply = Exchange(
      Post(absl::StrCat("Connection: close\r\nContent-Length: ", body.size(), "\r\n"), body));
  EXPECT_EQ(reply.rfind("HTTP/1.1 200", 0), 0u) << reply;
}

// A client that reads a large answer (not streamed) slowly but steadily, each write progressing
// well within the write timeout, is cut off at write_timeout + size / http.min_send_bytes_per_s
// instead of holding the connection thread at its own pace: it gets only part of the body.
TEST_F(HttpLimitsTest, AClientReadingALargeAnswerSlowlyIsCutAtTheMinimumSendRate) {
  FakeWorker::Script script;
  script.tokens.assign(4000, std::string(1000, 'a'));  // ~12 MB over n = 3 choices
  script.edit_token = [](int i, lazyattn::v1::TokenChunk* chunk) {
    chunk->set_token_id(100 + i % 800);  // inside the fake model's vocabulary of 1,000
  };
  worker_.SetScript(script);
  HttpOptions o = Options();
  o.write_timeout = absl::Seconds(5);
  o.min_send_bytes_per_s = 12 << 20;  // deadline ~6 s after the answer is ready
  StartHttp(o);
  const int fd = Connect(http_->port());
  ASSERT_GE(fd, 0);
  const int rcvbuf = 64 << 10;
  ASSERT_EQ(setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf)), 0);
  const std::string request_body = R"({"messages": [{"role": "user", "content": "Hi?"}], "n": 3})";
  ASSERT_TRUE(SendAll(
      fd, Post(absl::StrCat("Content-Length: ", request_body.size(), "\r\nConnection: close\r\n"),
               request_body)));
  // 16 KiB every 32 ms (0.5 MB/s) for 8 s: a third of a full 4 MB send buffer frees in under 3 s,
  // inside the write timeout, while the whole answer would take ~25 s.
  std::string reply;
  std::vector<char> buf(16 << 10);
  bool closed = false;
  const absl::Time slow_until = absl::Now() + absl::Seconds(8);
  while (!closed && absl::Now() < slow_until) {
    const ssize_t n = recv(fd, buf.data(), buf.size(), MSG_DONTWAIT);
    if (n > 0) reply.append(buf.data(), static_cast<size_t>(n));
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
      closed = true;
    }
    absl::SleepFor(absl::Milliseconds(32));
  }
  if (!closed) reply += ReadAll(fd, &closed);  // what was sent before the cut, at full speed
  close(fd);
  EXPECT_TRUE(closed);
  const size_t head_end = reply.find("\r\n\r\n");
  ASSERT_NE(head_end, std::string::npos) << reply.substr(0, 200);
  ASSERT_EQ(reply.rfind("HTTP/1.1 200", 0), 0u) << reply.substr(0, 200);
  const size_t length_at = reply.find("Content-Length: ");
  ASSERT_LT(length_at, head_end);
  const size_t announced = std::stoul(reply.substr(length_at + 16));
  EXPECT_GT(announced, size_t{12'000'000});
  const size_t received = reply.size() - head_end - 4;
  EXPECT_LT(received, announced) << "the slow client was served the whole answer";
  EXPECT_GT(received, size_t{0});
}

TEST_F(HttpLimitsTest, RequestsAreServedWhileSlowClientsTakeEveryThread) {
  HttpOptions o = Options();
  o.threads = 2;
  o.max_queued_connections = 16;
  o.header_timeout = absl::Milliseconds(500);
  StartHttp(o);
  // Three times as many trickling clients as threads, each sending a header byte every 100 ms
  // for up to 30 s.
  std::vector<int> slow;
  for (int i = 0; i < 6; ++i) {
    const int fd = Connect(http_->port(), kOtherAddress);
    ASSERT_GE(fd, 0);
    slow.push_back(fd);
  }
  std::atomic<bool> stop{false};
  std::thread trickle([&] {
    for (int i = 0; i < 300 && !stop.load(); ++i) {
      for (int fd : slow) (void)!send(fd, i == 0 ? "G" : "a", 1, MSG_NOSIGNAL);
      absl::SleepFor(absl::Milliseconds(100));
    }
  });
  EXPECT_TRUE(WaitFor([&] { return http_->open_connections() == 2; }, absl::Seconds(10)));
  // Queued behind them: served once the header timeout frees the threads (they are not freed
  // otherwise while the bytes keep coming, and the client gives up after 10 s).
  const absl::Time start = absl::Now();
  const std::string reply = Exchange(kModels);
  const absl::Duration took = absl::Now() - start;
  stop = true;
  trickle.join();
  for (int fd : slow) close(fd);
  EXPECT_EQ(reply.rfind("HTTP/1.1 200", 0), 0u) << reply << " after " << took;
}

TEST_F(HttpLimitsTest, AnAddressOverItsShareIsRefusedAtOnceAndOthersAreServed) {
  HttpOptions o = Options();
  o.threads = 4;
  o.max_connections_per_client = 2;
  o.header_timeout = absl::Seconds(60);
  o.keep_alive_timeout = absl::Seconds(60);
  StartHttp(o);
  // Two idle connections from one address hold two threads.
  std::vector<int> idle;
  for (int i = 0; i < 2; ++i) {
    const int fd = Connect(http_->port(), kOtherAddress);
    ASSERT_GE(fd, 0);
    idle.push_back(fd);
  }
  ASSERT_TRUE(WaitFor([&] { return http_->open_connections() == 2; }, absl::Seconds(10)));
  // A third from that address: 503 without its request being read, then closed.
  {
    const int fd = Connect(http_->port(), kOtherAddress);
    ASSERT_GE(fd, 0);
    bool closed = false;
    const std::string reply = ReadAll(fd, &closed);
    close(fd);
    EXPECT_EQ(reply.rfind("HTTP/1.1 503", 0), 0u) << reply;
    EXPECT_NE(reply.find("http.max_connections_per_client 2"), std::string::npos) << reply;
    EXPECT_TRUE(closed);
  }
  // Another address is served, and the first one again once its connections are gone.
  EXPECT_EQ(Exchange(kModels).rfind("HTTP/1.1 200", 0), 0u);
  for (int fd : idle) close(fd);
  ASSERT_TRUE(WaitFor([&] { return http_->open_connections() == 0; }, absl::Seconds(10)));
  const std::string again = Exchange(kModels, nullptr, kOtherAddress);
  EXPECT_EQ(again.rfind("HTTP/1.1 200", 0), 0u) << again;
}

TEST_F(HttpLimitsTest, ConnectionsBeyondTheQueuesAreAnswered503AtOnceBehindSlowOnes) {
  HttpOptions o = Options();
  o.threads = 1;
  o.max_queued_connections = 0;
  o.header_timeout = absl::Seconds(60);
  o.keep_alive_timeout = absl::Seconds(60);
  StartHttp(o);
  // A client that sends nothing holds the only thread; a second one waits to be shed.
  const int first = Connect(http_->port(), kOtherAddress);
  ASSERT_GE(first, 0);
  ASSERT_TRUE(WaitFor([&] { return http_->open_connections() == 1; }, absl::Seconds(10)));
  const int second = Connect(http_->port(), kOtherAddress);
  ASSERT_GE(second, 0);
  // The shed thread answers without reading a request, so the silent client before this one does
  // not delay its 503 (it waited for that client's headers before, up to 60 s here).
  const std::string reply = Exchange(kModels);
  close(first);
  close(second);
  EXPECT_EQ(reply.rfind("HTTP/1.1 503", 0), 0u) << reply;
  EXPECT_NE(reply.find("http.max_queued_connections"), std::string::npos) << reply;
}

TEST_F(HttpLimitsTest, ATlsHandshakeThatNeverEndsIsClosedAtTheHeaderTimeout) {
  ASSERT_NO_FATAL_FAILURE(MakeCertificates("http-limits-certs-"));
  HttpOptions o = Options();
  o.header_timeout = absl::Milliseconds(500);
  TlsOptions tls;
  tls.cert_file = certs_ + "/router-0.crt";
  tls.key_file = certs_ + "/router-0.key";
  StartHttp(o, tls);
  ASSERT_TRUE(http_->tls());
  // A TCP connection that sends one byte of a ClientHello and then nothing: the handshake waited
  // for the read timeout (30 s) per byte before.
  const int fd = Connect(http_->port());
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(SendAll(fd, std::string(1, '\x16')));
  const absl::Time start = absl::Now();
  bool closed = false;
  ReadAll(fd, &closed);
  const absl::Duration took = absl::Now() - start;
  close(fd);
  EXPECT_TRUE(closed) << "still open after " << took;

  // A real client still gets through, over the router's TLS stream.
  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  const int tls_fd = Connect(http_->port());
  ASSERT_GE(tls_fd, 0);
  SSL* ssl = SSL_new(ctx);
  SSL_set_fd(ssl, tls_fd);
  ASSERT_EQ(SSL_connect(ssl), 1);
  ASSERT_EQ(SSL_write(ssl, kModels, static_cast<int>(sizeof(kModels) - 1)),
            static_cast<int>(sizeof(kModels) - 1));
  std::string reply;
  char buf[4096];
  for (int n; (n = SSL_read(ssl, buf, sizeof(buf))) > 0;) reply.append(buf, static_cast<size_t>(n));
  SSL_free(ssl);
  close(tls_fd);
  SSL_CTX_free(ctx);
  EXPECT_EQ(reply.rfind("HTTP/1.1 200", 0), 0u) << reply;
}

// The head cap holds over TLS as over plaintext (the TLS stream counts the decrypted bytes): a
// request whose headers pass http.max_header_bytes is answered 431 naming the key, and closed;
// one within it is served on the same listener.
TEST_F(HttpLimitsTest, OverTlsHeadersBeyondTheCapAre431AndTheConnectionClosed) {
  ASSERT_NO_FATAL_FAILURE(MakeCertificates("http-head-tls-certs-"));
  HttpOptions o = Options();
  o.max_header_bytes = 16 << 10;
  TlsOptions tls;
  tls.cert_file = certs_ + "/router-0.crt";
  tls.key_file = certs_ + "/router-0.key";
  StartHttp(o, tls);
  ASSERT_TRUE(http_->tls());
  // Sends `request` over a new TLS connection (the certificate is not verified); the reply until
  // the router closes, and whether it closed.
  auto exchange = [&](const std::string& request, bool* closed) {
    SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
    const int fd = Connect(http_->port());
    std::string reply;
    SSL* ssl = SSL_new(ctx);
    SSL_set_fd(ssl, fd);
    if (fd >= 0 && SSL_connect(ssl) == 1) {
      // The router may stop reading before all is sent: the write's result is no matter.
      (void)SSL_write(ssl, request.data(), static_cast<int>(request.size()));
      char buf[4096];
      int n;
      while ((n = SSL_read(ssl, buf, sizeof(buf))) > 0) reply.append(buf, static_cast<size_t>(n));
      *closed = n <= 0;
    }
    SSL_free(ssl);
    if (fd >= 0) close(fd);
    SSL_CTX_free(ctx);
    return reply;
  };
  std::string head = "GET /v1/models HTTP/1.1\r\nHost: x\r\n";
  while (head.size() < (24 << 10)) head += "X-Pad: 0123456789abcdef0123456789abcdef\r\n";
  bool closed = false;
  std::string reply = exchange(head + "\r\n", &closed);
  EXPECT_EQ(reply.rfind("HTTP/1.1 431", 0), 0u) << reply.substr(0, 200);
  EXPECT_NE(reply.find("http.max_header_bytes (16384 bytes)"), std::string::npos) << reply;
  EXPECT_NE(reply.find("Connection: close"), std::string::npos) << reply;
  EXPECT_TRUE(closed);
  std::string within = "GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n";
  while (within.size() < (15 << 10)) within += "X-Pad: 0123456789abcdef0123456789abcdef\r\n";
  reply = exchange(within + "\r\n", &closed);
  EXPECT_EQ(reply.rfind("HTTP/1.1 200", 0), 0u) << reply.substr(0, 200);
}

}  // namespace
}  // namespace lazyattn::router
