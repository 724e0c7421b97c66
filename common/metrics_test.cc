// The /metrics endpoint over a real socket: the registry's text format on GET /metrics, 404 for
// other paths, 405 for other methods, an OS-chosen port, and a prompt shutdown.
#include "common/metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>

#include <prometheus/counter.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lazyattn {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

std::string Fetch(int port, const std::string& request) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return "connect failed";
  }
  send(fd, request.data(), request.size(), 0);
  std::string response;
  char buffer[4096];
  ssize_t n;
  while ((n = recv(fd, buffer, sizeof(buffer), 0)) > 0) response.append(buffer, n);
  close(fd);
  return response;
}

TEST(MetricsEndpointTest, ServesTheRegistryOnAnOsChosenPort) {
  auto registry = std::make_shared<prometheus::Registry>();
  auto& family = prometheus::BuildCounter().Name("lazyattn_test_total").Help("a test").Register(
      *registry);
  family.Add({{"kind", "x"}}).Increment(3);
  auto endpoint = MetricsEndpoint::Start("127.0.0.1:0", registry);
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  const int port = (*endpoint)->port();
  ASSERT_GT(port, 0);

  const std::string ok = Fetch(port, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_THAT(ok, StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_THAT(ok, HasSubstr("lazyattn_test_total{kind=\"x\"} 3"));
  EXPECT_THAT(Fetch(port, "GET /other HTTP/1.1\r\n\r\n"), StartsWith("HTTP/1.1 404"));
  EXPECT_THAT(Fetch(port, "POST /metrics HTTP/1.1\r\n\r\n"), StartsWith("HTTP/1.1 405"));

  // A second endpoint on the same port is refused with the address in the message.
  auto clash = MetricsEndpoint::Start("127.0.0.1:" + std::to_string(port), registry);
  EXPECT_EQ(clash.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(clash.status().message(), HasSubstr(std::to_string(port)));

  const auto before = std::chrono::steady_clock::now();
  endpoint->reset();
  EXPECT_LT(std::chrono::steady_clock::now() - before, std::chrono::seconds(1));
  EXPECT_EQ(Fetch(port, "GET /metrics HTTP/1.1\r\n\r\n"), "connect failed");
}

TEST(MetricsEndpointTest, BadAddressesAreUnavailableNamingThem) {
  auto registry = std::make_shared<prometheus::Registry>();
  for (const char* address : {"no-port", "256.1.1.1:80", "127.0.0.1:notaport"}) {
    auto e = MetricsEndpoint::Start(address, registry);
    EXPECT_EQ(e.status().code(), absl::StatusCode::kUnavailable) << address;
    EXPECT_THAT(e.status().message(), HasSubstr(address));
  }
}

}  // namespace
}  // namespace lazyattn
