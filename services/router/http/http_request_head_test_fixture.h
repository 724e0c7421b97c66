// The fixture of the tests of what the HTTP listener does with a request's head
// (http_request_head_test.cc, http_request_keys_test.cc): a router with one fake worker and an
// HTTP listener started by each test with the options and API key processor it needs, and raw
// sockets to talk to it.
#ifndef LAZYATTN_SERVICES_ROUTER_HTTP_HTTP_REQUEST_HEAD_TEST_FIXTURE_H_
#define LAZYATTN_SERVICES_ROUTER_HTTP_HTTP_REQUEST_HEAD_TEST_FIXTURE_H_

#include <gtest/gtest.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"
#include "services/router/http/http_server.h"
#include "services/router/http/raw_http_client_for_test.h"
#include "services/router/server/fake_cluster_for_test.h"
#include "services/router/server/router_server.h"

namespace lazyattn::router::http_test {

using testing::Connect;
using testing::FakeKvdir;
using testing::FakeWorker;
using testing::ReadAll;
using testing::SendAll;
using testing::StartOneWorkerRouter;

inline constexpr char kChatBody[] =
    R"({"messages": [{"role": "user", "content": "Hi?"}], "max_tokens": 8})";
// A request that, sent as another request's body, the router would answer if it read it as one.
inline constexpr char kSmuggled[] = "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n";

// The JSON body of a one-response reply.
inline nlohmann::json BodyOf(const std::string& reply) {
  const size_t at = reply.find("\r\n\r\n");
  if (at == std::string::npos) return nullptr;
  nlohmann::json body =
      nlohmann::json::parse(reply.substr(at + 4), nullptr, /*allow_exceptions=*/false);
  return body.is_discarded() ? nullptr : body;
}

class HttpRequestHeadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto server = StartOneWorkerRouter(worker_, kvdir_);
    ASSERT_TRUE(server.ok()) << server.status();
    router_ = std::move(*server);
  }

  void StartHttp(const HttpOptions& options,
                 std::shared_ptr<grpc::AuthMetadataProcessor> auth = nullptr) {
    auto http = HttpServer::Create(options, TlsOptions{}, &router_->context(), std::move(auth));
    ASSERT_TRUE(http.ok()) << http.status();
    http_ = std::move(*http);
  }

  // Timeouts no test reaches: only the limits under test can explain an answer or a close.
  static HttpOptions Options() {
    HttpOptions o;
    o.listen = "127.0.0.1:0";
    o.read_timeout = absl::Seconds(60);
    o.header_timeout = absl::Seconds(60);
    o.body_timeout = absl::Seconds(60);
    o.max_connections_per_client = 0;
    return o;
  }

  // Sends `request` on a new connection; the reply until the server closes (or 10 s of silence).
  std::string Exchange(const std::string& request, bool* closed = nullptr) {
    const int fd = Connect(http_->port());
    if (fd < 0) return "(no connection)";
    std::string reply = SendAll(fd, request) ? ReadAll(fd, closed) : "(send failed)";
    close(fd);
    return reply;
  }

  FakeWorker worker_{"w0"};
  FakeKvdir kvdir_;
  std::unique_ptr<RouterServer> router_;
  std::unique_ptr<HttpServer> http_;  // shut down before the router
};

// The head of a chat request for a body of `body_bytes`.
inline std::string ChatHead(const std::string& extra_headers, size_t body_bytes) {
  return absl::StrCat(
      "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n",
      extra_headers, "Connection: close\r\nContent-Length: ", body_bytes, "\r\n\r\n");
}

}  // namespace lazyattn::router::http_test

#endif  // LAZYATTN_SERVICES_ROUTER_HTTP_HTTP_REQUEST_HEAD_TEST_FIXTURE_H_
