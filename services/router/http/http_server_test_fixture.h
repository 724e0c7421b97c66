// The pieces of the HTTP listener's tests over real sockets (http_server_test.cc,
// http_choices_test.cc): a raw client, and a fixture running the listener in front of a router
// with one scripted fake worker and a fake KV directory.
#ifndef LAZYATTN_SERVICES_ROUTER_HTTP_HTTP_SERVER_TEST_FIXTURE_H_
#define LAZYATTN_SERVICES_ROUTER_HTTP_HTTP_SERVER_TEST_FIXTURE_H_

#include <arpa/inet.h>
#include <dirent.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"
#include "services/router/http/http_server.h"
#include "services/router/server/fake_cluster_for_test.h"
#include "services/router/server/router_server.h"

// Not lazyattn::router::testing: raw_http_client_for_test.h, in the same test binary, has a
// Connect of its own there.
namespace lazyattn::router::http_test {

using testing::FakeKvdir;
using testing::FakeWorker;

inline int Connect(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  // A listener that stopped accepting fills its kernel backlog, and connect() then waits.
  timeval connect_timeout{0, 300000};
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &connect_timeout, sizeof(connect_timeout));
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  timeval tv{5, 0};  // a read that waits longer is a failure of the test
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  return fd;
}

// Everything the server sends until it closes the connection or 5 s pass without a byte.
inline std::string ReadAll(int fd) {
  std::string out;
  char buf[4096];
  while (true) {
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n <= 0) return out;
    out.append(buf, static_cast<size_t>(n));
  }
}

// The response's status line and headers (read until the blank line, or 5 s of silence).
inline std::string ReadHead(int fd) {
  std::string out;
  char c;
  while (out.find("\r\n\r\n") == std::string::npos && read(fd, &c, 1) == 1) out.push_back(c);
  return out;
}

inline int OpenFds() {
  int n = 0;
  DIR* d = opendir("/proc/self/fd");
  while (readdir(d) != nullptr) ++n;
  closedir(d);
  return n;
}

class HttpServerTest : public ::testing::Test {
 protected:
  void StartRouter() {
    auto server = StartOneWorkerRouter(worker_, kvdir_);
    ASSERT_TRUE(server.ok()) << server.status();
    router_ = std::move(*server);
  }

  void StartHttp(const HttpOptions& options, std::shared_ptr<grpc::AuthMetadataProcessor> auth) {
    auto http = HttpServer::Create(options, TlsOptions{}, &router_->context(), std::move(auth));
    ASSERT_TRUE(http.ok()) << http.status();
    http_ = std::move(*http);
  }

  static HttpOptions Options() {
    HttpOptions o;
    o.listen = "127.0.0.1:0";
    return o;
  }

  // One POST on its own connection; the whole reply as it came (head, then the body, chunked
  // when streamed).
  // `headers`: more header lines, each ending in \r\n.
  std::string Post(const std::string& path, const std::string& body,
                   const std::string& headers = "") {
    const std::string request = absl::StrCat(
        "POST ", path, " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n", headers,
        "Connection: close\r\nContent-Length: ", body.size(), "\r\n\r\n", body);
    const int fd = Connect(http_->port());
    if (fd < 0) return "(no connection)";
    const bool sent =
        write(fd, request.data(), request.size()) == static_cast<ssize_t>(request.size());
    std::string reply = sent ? ReadAll(fd) : "(send failed)";
    close(fd);
    return reply;
  }

  FakeWorker worker_{"w0"};
  FakeKvdir kvdir_;
  std::unique_ptr<RouterServer> router_;
  std::unique_ptr<HttpServer> http_;  // shut down before the router
};

// The JSON objects of a reply: the body of a whole response, or each SSE event's data.
inline std::vector<nlohmann::json> JsonOf(const std::string& reply) {
  std::vector<nlohmann::json> out;
  const size_t body = reply.find("\r\n\r\n");
  if (body == std::string::npos) return out;
  if (reply.find("text/event-stream") == std::string::npos) {
    out.push_back(nlohmann::json::parse(reply.substr(body + 4), nullptr, false));
    return out;
  }
  for (const absl::string_view line : absl::StrSplit(reply.substr(body + 4), '\n')) {
    if (absl::StartsWith(line, "data: {")) {
      out.push_back(nlohmann::json::parse(std::string(line.substr(6)), nullptr, false));
    }
  }
  return out;
}

}  // namespace lazyattn::router::http_test

#endif  // LAZYATTN_SERVICES_ROUTER_HTTP_HTTP_SERVER_TEST_FIXTURE_H_
