// The HTTPS listener's certificate rotation without a restart, over real TLS connections on
// 127.0.0.1: a pair moved over the files a running router was started with is presented to new
// connections within the refresh interval, a stream opened before keeps its connection to the
// end, and a pair that does not load leaves the previous certificate in service. Certificates
// come from tools/gen-certs (run from the source tree, as ctest does).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/test_certs_for_test.h"
#include "services/router/http/http_server.h"
#include "services/router/server/fake_cluster_for_test.h"
#include "services/router/server/router_server.h"

namespace lazyattn::router {
namespace {

using testing::FakeKvdir;
using testing::WaitFor;
using testing::RouterOptionsForFakeKvdir;
using testing::FakeWorker;

std::string SerialHex(X509* cert) {
  if (cert == nullptr) return "";
  BIGNUM* bn = ASN1_INTEGER_to_BN(X509_get_serialNumber(cert), nullptr);
  char* hex = BN_bn2hex(bn);
  std::string out = hex;
  OPENSSL_free(hex);
  BN_free(bn);
  return out;
}

std::string FileSerial(const std::string& path) {
  FILE* f = fopen(path.c_str(), "r");
  if (f == nullptr) return "";
  X509* cert = PEM_read_X509(f, nullptr, nullptr, nullptr);
  fclose(f);
  std::string serial = SerialHex(cert);
  X509_free(cert);
  return serial;
}

// One TLS client connection to 127.0.0.1:port (the certificate is not verified: the test reads
// which one was presented).
class TlsConnection {
 public:
  explicit TlsConnection(int port) {
    ctx_ = SSL_CTX_new(TLS_client_method());
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    timeval tv{10, 0};  // a read that waits longer is a failure of the test
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    if (connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) return;
    ssl_ = SSL_new(ctx_);
    SSL_set_fd(ssl_, fd_);
    connected_ = SSL_connect(ssl_) == 1;
  }
  ~TlsConnection() {
    if (ssl_ != nullptr) SSL_free(ssl_);
    if (fd_ >= 0) close(fd_);
    SSL_CTX_free(ctx_);
  }

  bool connected() const { return connected_; }
  // The serial of the certificate the server presented ("" without a handshake).
  std::string PeerSerial() const {
    if (!connected_) return "";
    X509* cert = SSL_get1_peer_certificate(ssl_);
    std::string serial = SerialHex(cert);
    X509_free(cert);
    return serial;
  }
  bool Write(const std::string& data) {
    return connected_ && SSL_write(ssl_, data.data(), static_cast<int>(data.size())) ==
                             static_cast<int>(data.size());
  }
  // Everything until the server closes, or 10 s pass without a byte.
  std::string ReadAll() {
    std::string out;
    char buf[4096];
    while (connected_) {
      const int n = SSL_read(ssl_, buf, sizeof(buf));
      if (n <= 0) break;
      out.append(buf, static_cast<size_t>(n));
    }
    return out;
  }

 private:
  SSL_CTX* ctx_ = nullptr;
  SSL* ssl_ = nullptr;
  int fd_ = -1;
  bool connected_ = false;
};

std::string StreamRequest() {
  const std::string body =
      R"({"messages": [{"role": "user", "content": "Hi?"}], "stream": true, "max_tokens": 8})";
  return absl::StrCat(
      "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
      "Connection: close\r\nContent-Length: ",
      body.size(), "\r\n\r\n", body);
}

class HttpTlsReloadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    certs_ = lazyattn::testing::MakeTestCerts("http-tls-certs");
    ASSERT_FALSE(certs_.empty()) << "tools/gen-certs (run from the source tree) failed";
    std::filesystem::copy_file(certs_ + "/router-0.crt", certs_ + "/live.crt");
    std::filesystem::copy_file(certs_ + "/router-0.key", certs_ + "/live.key");

    auto server = StartOneWorkerRouter(worker_, kvdir_);
    ASSERT_TRUE(server.ok()) << server.status();
    router_ = std::move(*server);

    HttpOptions http;
    http.listen = "127.0.0.1:0";
    TlsOptions tls;
    tls.cert_file = certs_ + "/live.crt";
    tls.key_file = certs_ + "/live.key";
    tls.refresh_interval_s = 1;
    auto started = HttpServer::Create(http, tls, &router_->context(), nullptr);
    ASSERT_TRUE(started.ok()) << started.status();
    http_ = std::move(*started);
    ASSERT_TRUE(http_->tls());
  }

  void TearDown() override {
    http_.reset();
    std::filesystem::remove_all(certs_);
  }

  // A new certificate from the same CA, written as NAME.crt/.key beside the live pair.
  std::string NewPair(const std::string& name) {
    EXPECT_EQ(std::system(absl::StrCat("tools/gen-certs cert router ", name, " --out '", certs_,
                                       "' >/dev/null")
                              .c_str()),
              0);
    return FileSerial(certs_ + "/" + name + ".crt");
  }

  std::string certs_;
  FakeWorker worker_{"w0"};
  FakeKvdir kvdir_;
  std::unique_ptr<RouterServer> router_;
  std::unique_ptr<HttpServer> http_;  // shut down before the router
};

TEST_F(HttpTlsReloadTest, NewConnectionsGetTheRotatedCertificateAndAnOpenStreamFinishes) {
  const std::string old_serial = FileSerial(certs_ + "/live.crt");
  ASSERT_FALSE(old_serial.empty());
  {
    TlsConnection first(http_->port());
    ASSERT_TRUE(first.connected());
    EXPECT_EQ(first.PeerSerial(), old_serial);
  }
  // A stream held open by the worker across the rotation.
  FakeWorker::Script script;
  script.block = true;
  worker_.SetScript(script);
  TlsConnection stream(http_->port());
  ASSERT_TRUE(stream.connected());
  ASSERT_TRUE(stream.Write(StreamRequest()));
  ASSERT_TRUE(worker_.WaitForCalls(1, absl::Seconds(10)));

  const std::string new_serial = NewPair("router-0-next");
  ASSERT_FALSE(new_serial.empty());
  ASSERT_NE(new_serial, old_serial);
  // Moved over the files the listener was started with, key first, as an operator rotates.
  std::filesystem::rename(certs_ + "/router-0-next.key", certs_ + "/live.key");
  std::filesystem::rename(certs_ + "/router-0-next.crt", certs_ + "/live.crt");

  // Within a few refresh intervals (1 s here) a new connection is given the new certificate.
  const absl::Time rotated = absl::Now();
  std::string seen;
  EXPECT_TRUE(WaitFor(
      [&] {
        TlsConnection fresh(http_->port());
        seen = fresh.PeerSerial();
        return seen == new_serial;
      },
      absl::Seconds(10)))
      << "still presented " << seen;
  EXPECT_LT(absl::Now() - rotated, absl::Seconds(4));

  // The stream opened before the rotation runs to its end on its old connection.
  worker_.Unblock();
  const std::string reply = stream.ReadAll();
  EXPECT_EQ(reply.rfind("HTTP/1.1 200", 0), 0u) << reply;
  EXPECT_NE(reply.find(" world"), std::string::npos) << reply;
  EXPECT_NE(reply.find("[DONE]"), std::string::npos) << reply;
}

TEST_F(HttpTlsReloadTest, APairThatDoesNotLoadKeepsTheCurrentCertificate) {
  const std::string old_serial = FileSerial(certs_ + "/live.crt");
  const std::string new_serial = NewPair("router-0-next");
  ASSERT_NE(new_serial, old_serial);
  const auto presented = [&] {
    TlsConnection c(http_->port());
    EXPECT_TRUE(c.connected());
    return c.PeerSerial();
  };
  // A new certificate without its key: the live key no longer matches it.
  const auto overwrite = std::filesystem::copy_options::overwrite_existing;
  std::filesystem::copy_file(certs_ + "/router-0-next.crt", certs_ + "/live.crt.tmp", overwrite);
  std::filesystem::rename(certs_ + "/live.crt.tmp", certs_ + "/live.crt");
  absl::SleepFor(absl::Milliseconds(2500));  // two refreshes
  EXPECT_EQ(presented(), old_serial);
  // Not PEM at all.
  std::ofstream(certs_ + "/live.crt.tmp") << "not a certificate\n";
  std::filesystem::rename(certs_ + "/live.crt.tmp", certs_ + "/live.crt");
  absl::SleepFor(absl::Milliseconds(2500));
  EXPECT_EQ(presented(), old_serial);
  // A FIFO in the certificate's place: refused at once. The watcher opened it with fopen and
  // blocked there for good, so the pair below was never served, and the listener's shutdown
  // (which joins the watcher) hung.
  ASSERT_EQ(mkfifo((certs_ + "/live.crt.tmp").c_str(), 0600), 0);
  std::filesystem::rename(certs_ + "/live.crt.tmp", certs_ + "/live.crt");
  absl::SleepFor(absl::Milliseconds(2500));
  EXPECT_EQ(presented(), old_serial);
  // The matching pair arrives: it is served.
  std::filesystem::rename(certs_ + "/router-0-next.key", certs_ + "/live.key");
  std::filesystem::rename(certs_ + "/router-0-next.crt", certs_ + "/live.crt");
  std::string seen;
  EXPECT_TRUE(WaitFor([&] { return (seen = presented()) == new_serial; }, absl::Seconds(10)))
      << "still presented " << seen;
}

}  // namespace
}  // namespace lazyattn::router
