// The /metrics endpoint (prometheus-cpp's exposer) over real sockets: the registry's text format
// plus process and build metrics on GET /metrics, 404 for other paths, 405 for other methods,
// bearer tokens, idle connections that must not delay a scrape, and a process with large static
// TLS (as the CUDA worker has: cuBLASLt's 94 KiB) still starting the exposer's threads.
#include "common/metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <thread>
#include <cstdio>
#include <fstream>
#include <vector>

#include <prometheus/counter.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

// More static TLS than civetweb's 100 KiB thread stacks can hold: without common/thread_stack.cc
// the exposer cannot start a thread in this binary.
thread_local char g_large_tls[160 * 1024];

namespace lazyattn {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

int Connect(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

std::string Fetch(int port, const std::string& request) {
  const int fd = Connect(port);
  if (fd < 0) return "connect failed";
  timeval timeout = {10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  std::string response;
  char buffer[4096];
  ssize_t n;
  while ((n = recv(fd, buffer, sizeof(buffer), 0)) > 0) response.append(buffer, n);
  close(fd);
  return response;
}

std::string Get(int port, const std::string& path, const std::string& headers = "") {
  return Fetch(port, "GET " + path + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + headers +
                         "\r\n");
}

std::shared_ptr<prometheus::Registry> TestRegistry() {
  auto registry = std::make_shared<prometheus::Registry>();
  auto& family =
      prometheus::BuildCounter().Name("lazyattn_test_total").Help("a test").Register(*registry);
  family.Add({{"kind", "x"}}).Increment(3);
  return registry;
}

TEST(MetricsEndpointTest, ServesTheRegistryProcessAndBuildMetricsOnAnOsChosenPort) {
  g_large_tls[0] = 1;  // the TLS block is this binary's, whether or not a test touches it
  auto endpoint = MetricsEndpoint::Start("127.0.0.1:0", TestRegistry());
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  const int port = (*endpoint)->port();
  ASSERT_GT(port, 0);

  const std::string ok = Get(port, "/metrics");
  EXPECT_THAT(ok, StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_THAT(ok, HasSubstr("lazyattn_test_total{kind=\"x\"} 3"));
  EXPECT_THAT(ok, HasSubstr("lazyattn_build_info{"));
  EXPECT_THAT(ok, HasSubstr("git_sha=\""));
  for (const char* name : {"process_cpu_seconds_total ", "process_resident_memory_bytes ",
                           "process_open_fds ", "process_max_fds ",
                           "process_start_time_seconds ", "process_virtual_memory_bytes "}) {
    EXPECT_THAT(ok, HasSubstr(std::string("\n") + name)) << name;
  }
  EXPECT_THAT(Get(port, "/other"), StartsWith("HTTP/1.1 404"));
  EXPECT_THAT(Fetch(port, "POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n"),
              StartsWith("HTTP/1.1 405"));

  // A second endpoint on the same port is refused with the address in the message.
  auto clash = MetricsEndpoint::Start("127.0.0.1:" + std::to_string(port), TestRegistry());
  EXPECT_EQ(clash.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(clash.status().message(), HasSubstr(std::to_string(port)));

  const auto before = std::chrono::steady_clock::now();
  endpoint->reset();
  EXPECT_LT(std::chrono::steady_clock::now() - before, std::chrono::seconds(1));
  EXPECT_EQ(Get(port, "/metrics"), "connect failed");
}

TEST(MetricsEndpointTest, ABearerTokenIsRequiredWhenConfigured) {
  auto endpoint =
      MetricsEndpoint::Start("127.0.0.1:0", TestRegistry(), {.bearer_token = "s3cret-token"});
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  const int port = (*endpoint)->port();
  const std::string none = Get(port, "/metrics");
  EXPECT_THAT(none, StartsWith("HTTP/1.1 401"));
  EXPECT_THAT(none, HasSubstr("WWW-Authenticate: Bearer"));
  EXPECT_THAT(none, Not(HasSubstr("lazyattn_test_total")));
  EXPECT_THAT(Get(port, "/metrics", "Authorization: Bearer wrong-token!\r\n"),
              StartsWith("HTTP/1.1 401"));
  EXPECT_THAT(Get(port, "/metrics", "Authorization: Bearer s3cret-tokenX\r\n"),
              StartsWith("HTTP/1.1 401"));
  EXPECT_THAT(Get(port, "/metrics", "Authorization: Basic czNjcmV0LXRva2Vu\r\n"),
              StartsWith("HTTP/1.1 401"));
  const std::string good = Get(port, "/metrics", "Authorization: Bearer s3cret-token\r\n");
  EXPECT_THAT(good, StartsWith("HTTP/1.1 200"));
  EXPECT_THAT(good, HasSubstr("lazyattn_test_total{kind=\"x\"} 3"));
}

// Eight connections that never send a request (a stuck scraper, a port scan) hold civetweb
// threads until request_timeout_ms; a scrape meanwhile must still be answered at once. The bound
// (1 s, against 3 s of timeout) is generous for a loaded CI machine; an exposer with too few
// threads waits the full timeout.
TEST(MetricsEndpointTest, IdleConnectionsDoNotDelayAScrape) {
  auto endpoint = MetricsEndpoint::Start("127.0.0.1:0", TestRegistry());
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  const int port = (*endpoint)->port();
  std::vector<int> idle;
  for (int i = 0; i < 8; ++i) {
    const int fd = Connect(port);
    ASSERT_GE(fd, 0);
    idle.push_back(fd);
  }
  // One half-sent request too: a head that never ends.
  const std::string partial = "GET /metrics HTTP/1.1\r\nHost: x\r\n";
  send(idle.back(), partial.data(), partial.size(), MSG_NOSIGNAL);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // let the server take them all

  const auto start = std::chrono::steady_clock::now();
  const std::string scrape = Get(port, "/metrics");
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_THAT(scrape, HasSubstr("lazyattn_test_total{kind=\"x\"} 3"));
  EXPECT_LT(took, std::chrono::seconds(1))
      << std::chrono::duration<double>(took).count() << " s with 8 idle connections";
  for (int fd : idle) close(fd);
}

// A malformed address is configuration (InvalidArgument: the services exit 2); one that does not
// resolve or bind is Unavailable (exit 1). Port 99999 would be bound as 34463 by civetweb.
TEST(MetricsEndpointTest, BadAddressesAreRefusedNamingThem) {
  for (const char* address :
       {"no-port", "127.0.0.1:notaport", "127.0.0.1:", "127.0.0.1:99999", "127.0.0.1:-1"}) {
    auto e = MetricsEndpoint::Start(address, TestRegistry());
    EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument) << address;
    EXPECT_THAT(e.status().message(), HasSubstr(address));
  }
  auto unresolved = MetricsEndpoint::Start("256.1.1.1:80", TestRegistry());
  EXPECT_EQ(unresolved.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(unresolved.status().message(), HasSubstr("256.1.1.1:80"));
}

// The one start-up path of the three servers' metrics.listen / metrics.bearer_token_file.
TEST(StartMetricsEndpointTest, FollowsTheListenAndTokenFileKeys) {
  auto none = StartMetricsEndpoint("", "/no/such/token", TestRegistry());
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(*none, nullptr);

  auto open = StartMetricsEndpoint("127.0.0.1:0", "", TestRegistry());
  ASSERT_TRUE(open.ok()) << open.status();
  ASSERT_NE(*open, nullptr);
  EXPECT_THAT(Get((*open)->port(), "/metrics"), HasSubstr("lazyattn_test_total{kind=\"x\"} 3"));

  const std::string token_file = testing::TempDir() + "/start-token";
  std::ofstream(token_file) << "tok-123\n";
  auto guarded = StartMetricsEndpoint("127.0.0.1:0", token_file, TestRegistry());
  ASSERT_TRUE(guarded.ok()) << guarded.status();
  ASSERT_NE(*guarded, nullptr);
  EXPECT_THAT(Get((*guarded)->port(), "/metrics"), StartsWith("HTTP/1.1 401"));
  EXPECT_THAT(Get((*guarded)->port(), "/metrics", "Authorization: Bearer tok-123\r\n"),
              StartsWith("HTTP/1.1 200"));

  auto missing = StartMetricsEndpoint("127.0.0.1:0", "/no/such/token", TestRegistry());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(missing.status().message(), HasSubstr("metrics.bearer_token_file"));
  auto malformed = StartMetricsEndpoint("no-port", "", TestRegistry());
  EXPECT_EQ(malformed.status().code(), absl::StatusCode::kInvalidArgument);
  auto unbound = StartMetricsEndpoint("256.1.1.1:80", "", TestRegistry());
  EXPECT_EQ(unbound.status().code(), absl::StatusCode::kUnavailable);
}

TEST(ReadBearerTokenFileTest, TrimsTheTokenAndNamesTheKeyOnErrors) {
  const std::string dir = testing::TempDir();
  const std::string good = dir + "/token", empty = dir + "/empty", two = dir + "/two";
  std::ofstream(good) << "  abc.def \n";
  std::ofstream(empty) << "\n \n";
  std::ofstream(two) << "abc\ndef\n";
  auto t = ReadBearerTokenFile("metrics.bearer_token_file", good);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(*t, "abc.def");
  for (const std::string& path : {empty, two, dir + "/missing"}) {
    auto bad = ReadBearerTokenFile("metrics.bearer_token_file", path);
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << path;
    EXPECT_THAT(bad.status().message(), HasSubstr("metrics.bearer_token_file")) << path;
    EXPECT_THAT(bad.status().message(), HasSubstr(path));
  }
}

}  // namespace
}  // namespace lazyattn
