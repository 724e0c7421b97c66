// Keepalive of MakeChannel's channels against StartGrpcServer's servers: a connection whose peer
// stops answering (frozen behind a proxy that keeps both sockets open, as a node that lost power
// or a partition would) is given up within the keepalive's time and timeout, while a live idle
// connection keeps its pings without the server sending GOAWAY for too many of them; and a
// server closes a connection past its age (ServerOptions::max_connection_age_ms), so that a
// certificate checked at its handshake is checked again.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/grpc_util.h"
#include "gtest/gtest.h"

namespace lazyattn {
namespace {

// Forwards bytes between its clients and 127.0.0.1:`upstream_port`. Frozen, it reads nothing in
// either direction and closes nothing: the peers' bytes wait in socket buffers, unanswered.
class FreezableProxy {
 public:
  explicit FreezableProxy(int upstream_port) : upstream_port_(upstream_port) {
    listener_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (::bind(listener_, reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
        ::listen(listener_, 8) != 0 ||
        ::getsockname(listener_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      ADD_FAILURE() << "proxy cannot listen";
      return;
    }
    port_ = ntohs(addr.sin_port);
    accept_thread_ = std::thread([this] { AcceptLoop(); });
  }
  ~FreezableProxy() {
    stop_ = true;
    ::shutdown(listener_, SHUT_RDWR);
    if (accept_thread_.joinable()) accept_thread_.join();  // then nothing adds pumps
    for (std::thread& t : pumps_) t.join();
    ::close(listener_);
    for (int fd : fds_) ::close(fd);
  }

  int port() const { return port_; }
  // Connections the proxy has accepted (and opened upstream) so far.
  int connections() const { return connections_.load(); }
  void Freeze() { frozen_ = true; }
  // Whether the server closed the proxy's first upstream connection (its FIN arrived), waiting
  // up to `limit`; frozen or not, the proxy itself never closes it.
  bool UpstreamClosedWithin(absl::Duration limit) const {
    const absl::Time deadline = absl::Now() + limit;
    while (absl::Now() < deadline) {
      const int fd = first_upstream_.load();
      if (fd >= 0) {
        pollfd p{fd, POLLRDHUP, 0};
        if (::poll(&p, 1, 20) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0) {
          return true;
        }
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
    return false;
  }

 private:
  void AcceptLoop() {
    while (!stop_) {
      pollfd p{listener_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      const int client = ::accept(listener_, nullptr, nullptr);
      if (client < 0) continue;
      const int server = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      addr.sin_port = htons(static_cast<uint16_t>(upstream_port_));
      if (::connect(server, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
        ::close(client);
        ::close(server);
        continue;
      }
      fds_.push_back(client);
      fds_.push_back(server);
      int none = -1;
      first_upstream_.compare_exchange_strong(none, server);
      ++connections_;
      pumps_.emplace_back([this, client, server] { Pump(client, server); });
      pumps_.emplace_back([this, client, server] { Pump(server, client); });
    }
  }
  void Pump(int from, int to) {
    char buf[16384];
    while (!stop_) {
      if (frozen_) {
        absl::SleepFor(absl::Milliseconds(20));
        continue;
      }
      pollfd p{from, POLLIN, 0};
      if (::poll(&p, 1, 20) <= 0) continue;
      const ssize_t n = ::read(from, buf, sizeof(buf));
      if (n <= 0) return;  // closed: the other pump sees its own end
      for (ssize_t done = 0; done < n;) {
        // MSG_NOSIGNAL: a peer that closed (a server past the connection's age) is no SIGPIPE.
        const ssize_t w = ::send(to, buf + done, static_cast<size_t>(n - done), MSG_NOSIGNAL);
        if (w <= 0) return;
        done += w;
      }
    }
  }

  const int upstream_port_;
  int listener_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<bool> frozen_{false};
  std::atomic<int> first_upstream_{-1};
  std::atomic<int> connections_{0};
  std::thread accept_thread_;
  // Written by the accept thread only, read after it is joined.
  std::vector<std::thread> pumps_;
  std::vector<int> fds_;
};

// Waits up to `limit` for the channel to leave READY; true if it did.
bool LeavesReady(grpc::Channel& channel, absl::Duration limit) {
  const absl::Time deadline = absl::Now() + limit;
  while (absl::Now() < deadline) {
    if (channel.GetState(/*try_to_connect=*/false) != GRPC_CHANNEL_READY) return true;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return false;
}

TEST(GrpcKeepaliveTest, AFrozenPeerIsGivenUpAndALiveIdleOneIsKept) {
  // Pings every 500 ms here, not every 10 s: the server accepts them every 200 ms.
  auto built = StartGrpcServer(
      {.listen_address = "127.0.0.1:0", .reflection = true, .min_ping_interval_ms = 200}, {});
  ASSERT_TRUE(built.ok()) << built.status();
  FreezableProxy proxy(built->port);
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 500);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 500);
  auto channel = MakeChannel("127.0.0.1:" + std::to_string(proxy.port()), {}, 1 << 20, nullptr,
                             std::move(args));
  ASSERT_TRUE(channel.ok()) << channel.status();
  auto serving = CheckGrpcHealth(*channel, "", absl::Seconds(5));
  ASSERT_TRUE(serving.ok()) << serving.status();
  // Idle and pinged eight times: still the same connection (no GOAWAY for the pings).
  EXPECT_FALSE(LeavesReady(**channel, absl::Seconds(4)));
  proxy.Freeze();
  const absl::Time frozen_at = absl::Now();
  EXPECT_TRUE(LeavesReady(**channel, absl::Seconds(10)));
  EXPECT_LT(absl::Now() - frozen_at, absl::Seconds(5));
  built->server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
}

// The server's own keepalive: a client that stops answering (frozen behind the proxy) has its
// connection closed by the server, with its calls, within the server's keepalive time and
// timeout, though the client itself never pings (its channel's keepalive is set to a day).
TEST(GrpcKeepaliveTest, AServerClosesTheConnectionOfAFrozenClient) {
  auto built = StartGrpcServer({.listen_address = "127.0.0.1:0",
                                .reflection = true,
                                .keepalive_time_ms = 500,
                                .keepalive_timeout_ms = 500},
                               {});
  ASSERT_TRUE(built.ok()) << built.status();
  FreezableProxy proxy(built->port);
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 24 * 3600 * 1000);
  auto channel = MakeChannel("127.0.0.1:" + std::to_string(proxy.port()), {}, 1 << 20, nullptr,
                             std::move(args));
  ASSERT_TRUE(channel.ok()) << channel.status();
  auto serving = CheckGrpcHealth(*channel, "", absl::Seconds(5));
  ASSERT_TRUE(serving.ok()) << serving.status();
  // Answered pings keep the connection.
  EXPECT_FALSE(proxy.UpstreamClosedWithin(absl::Seconds(3)));
  proxy.Freeze();
  const absl::Time frozen_at = absl::Now();
  EXPECT_TRUE(proxy.UpstreamClosedWithin(absl::Seconds(10)));
  EXPECT_LT(absl::Now() - frozen_at, absl::Seconds(5));
  built->server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
}

// A connection past its age is closed by the server (GOAWAY, then the grace for its calls), and
// the channel's next call opens a new one: a handshake, where the peer's certificate is checked
// against the files as they are now. The first test above is the control: with the default
// age, an idle connection stays up.
TEST(GrpcConnectionAgeTest, AServerClosesAConnectionPastItsAgeAndTheClientReconnects) {
  auto built = StartGrpcServer({.listen_address = "127.0.0.1:0",
                                .reflection = true,
                                .max_connection_age_ms = 500,
                                .max_connection_age_grace_ms = 500},
                               {});
  ASSERT_TRUE(built.ok()) << built.status();
  FreezableProxy proxy(built->port);
  auto channel = MakeChannel("127.0.0.1:" + std::to_string(proxy.port()), {}, 1 << 20);
  ASSERT_TRUE(channel.ok()) << channel.status();
  const absl::Time connected_at = absl::Now();
  auto serving = CheckGrpcHealth(*channel, "", absl::Seconds(5));
  ASSERT_TRUE(serving.ok()) << serving.status();
  EXPECT_TRUE(proxy.UpstreamClosedWithin(absl::Seconds(5)));
  EXPECT_GE(absl::Now() - connected_at, absl::Milliseconds(400));  // the age, less its jitter
  EXPECT_EQ(proxy.connections(), 1);
  serving = CheckGrpcHealth(*channel, "", absl::Seconds(5));
  EXPECT_TRUE(serving.ok()) << serving.status();
  EXPECT_EQ(proxy.connections(), 2);
  built->server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
}

// Why connections age: a certificate is checked only at the handshake. Once the server's CA file
// no longer vouches for a client's certificate (its CA rotated out), the connection made before
// still serves that client, until its age closes it; the handshake of the next one refuses the
// certificate. (Servers run with an hour, kMaxConnectionAgeMs; here 4 s.)
TEST(GrpcConnectionAgeTest, ACertificateTheServerNoLongerTrustsIsRefusedOnceItsConnectionAges) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/connection-age-tls-", getpid());
  ASSERT_EQ(std::system(absl::StrCat("tools/gen-certs --out '", dir,
                                     "/a' --workers 1 --force "
                                     ">/dev/null && tools/gen-certs --out '",
                                     dir, "/b' --workers 0 --force >/dev/null")
                            .c_str()),
            0)
      << "tools/gen-certs (run from the source tree) failed";
  const std::string live_ca = dir + "/live-ca.crt";
  std::filesystem::copy_file(dir + "/a/ca.crt", live_ca,
                             std::filesystem::copy_options::overwrite_existing);
  auto built = StartGrpcServer({.listen_address = "127.0.0.1:0",
                                .tls = {.cert_file = dir + "/a/kvdir.crt",
                                        .key_file = dir + "/a/kvdir.key",
                                        .ca_file = live_ca,
                                        .refresh_interval_s = 1},
                                .reflection = true,
                                .max_connection_age_ms = 4000,
                                .max_connection_age_grace_ms = 500},
                               {});
  ASSERT_TRUE(built.ok()) << built.status();
  FreezableProxy proxy(built->port);
  auto channel = MakeChannel("127.0.0.1:" + std::to_string(proxy.port()),
                             {.cert_file = dir + "/a/worker-0.crt",
                              .key_file = dir + "/a/worker-0.key",
                              .ca_file = dir + "/a/ca.crt"},
                             1 << 20);
  ASSERT_TRUE(channel.ok()) << channel.status();
  auto serving = CheckGrpcHealth(*channel, "", absl::Seconds(5));
  ASSERT_TRUE(serving.ok()) << serving.status();
  // The server trusts only CA b from now on (written beside, renamed over, as rotated).
  std::filesystem::copy_file(dir + "/b/ca.crt", live_ca + ".tmp",
                             std::filesystem::copy_options::overwrite_existing);
  std::filesystem::rename(live_ca + ".tmp", live_ca);
  absl::SleepFor(absl::Milliseconds(1500));  // past the server's next read of its files
  serving = CheckGrpcHealth(*channel, "", absl::Seconds(5));
  EXPECT_TRUE(serving.ok()) << "the open connection serves on: " << serving.status();
  EXPECT_EQ(proxy.connections(), 1);
  EXPECT_TRUE(proxy.UpstreamClosedWithin(absl::Seconds(10)));
  serving = CheckGrpcHealth(*channel, "", absl::Seconds(3));
  EXPECT_FALSE(serving.ok()) << "a new connection took worker-0's certificate of CA a";
  EXPECT_GE(proxy.connections(), 2);
  // The control: the server did load CA b, whose certificates it takes on a new connection.
  auto of_b = MakeChannel("127.0.0.1:" + std::to_string(built->port),
                          {.cert_file = dir + "/b/router-0.crt",
                           .key_file = dir + "/b/router-0.key",
                           .ca_file = dir + "/a/ca.crt"},
                          1 << 20);
  ASSERT_TRUE(of_b.ok()) << of_b.status();
  serving = CheckGrpcHealth(*of_b, "", absl::Seconds(5));
  EXPECT_TRUE(serving.ok()) << serving.status();
  built->server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
  std::filesystem::remove_all(dir);  // CA keys
}

}  // namespace
}  // namespace lazyattn
