// The gRPC health check client against a real server's grpc.health.v1 service, and the
// arguments every client channel is made with.
#include "common/grpc_util.h"

#include <grpcpp/alarm.h>
#include <grpcpp/health_check_service_interface.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/auth.h"
#include "common/monotonic_time.h"
#include "common/test_certs_for_test.h"
#include "gtest/gtest.h"

namespace lazyattn {
namespace {

// Every client channel reconnects to a peer that was down within kMaxReconnectBackoffMs (gRPC's
// own backoff grows to 120 s), keeps its connections alive with pings, and keeps what a caller
// set itself.
TEST(ClientChannelArgumentsTest, BoundTheReconnectBackoffAndKeepTheCallersOwn) {
  const grpc::ChannelArguments defaults = ClientChannelArguments({}, 1 << 20);
  auto value = [](const grpc::ChannelArguments& args, const char* key) {
    const grpc_channel_args c = args.c_channel_args();
    int found = -1;
    for (size_t i = 0; i < c.num_args; ++i) {
      if (std::strcmp(c.args[i].key, key) == 0) found = c.args[i].value.integer;
    }
    return found;
  };
  EXPECT_EQ(value(defaults, GRPC_ARG_MAX_RECONNECT_BACKOFF_MS), kMaxReconnectBackoffMs);
  EXPECT_EQ(value(defaults, GRPC_ARG_KEEPALIVE_TIME_MS), kKeepaliveTimeMs);
  EXPECT_EQ(value(defaults, GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH), 1 << 20);
  EXPECT_FALSE(HasChannelArgument(defaults, GRPC_ARG_MIN_RECONNECT_BACKOFF_MS));
  grpc::ChannelArguments own;
  own.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  EXPECT_EQ(value(ClientChannelArguments(own, 1 << 20), GRPC_ARG_MAX_RECONNECT_BACKOFF_MS), 2000);
}

// A MonotonicNow() deadline is a wait of the time left on gRPC's monotonic clock: an alarm fires
// neither at once (as a monotonic value read as a wall-clock date, decades past, would) nor never.
TEST(GrpcMonotonicDeadlineTest, AnAlarmWaitsTheTimeLeft) {
  const absl::Time start = MonotonicNow();
  absl::Notification fired;
  grpc::Alarm alarm;
  alarm.Set(GrpcMonotonicDeadline(start + absl::Milliseconds(300)), [&fired](bool ok) {
    EXPECT_TRUE(ok);
    fired.Notify();
  });
  ASSERT_TRUE(fired.WaitForNotificationWithTimeout(absl::Seconds(20)));
  EXPECT_GE(MonotonicNow() - start, absl::Milliseconds(299));

  const gpr_timespec past = GrpcMonotonicDeadline(start - absl::Hours(1));
  EXPECT_EQ(past.clock_type, GPR_CLOCK_MONOTONIC);
  EXPECT_LE(gpr_time_cmp(past, gpr_now(GPR_CLOCK_MONOTONIC)), 0);
  const gpr_timespec never = GrpcMonotonicDeadline(absl::InfiniteFuture());
  EXPECT_EQ(gpr_time_cmp(never, gpr_inf_future(GPR_CLOCK_MONOTONIC)), 0);
}

TEST(CheckGrpcHealthTest, ReportsTheServersStatus) {
  // gRPC builds no server without a service to poll for; reflection is the one at hand here.
  auto built = StartGrpcServer({.listen_address = "127.0.0.1:0", .reflection = true}, {});
  ASSERT_TRUE(built.ok()) << built.status();
  auto channel = MakeChannel("127.0.0.1:" + std::to_string(built->port), {});
  ASSERT_TRUE(channel.ok()) << channel.status();
  auto serving = CheckGrpcHealth(*channel, "", absl::Seconds(5));
  ASSERT_TRUE(serving.ok()) << serving.status();
  EXPECT_TRUE(*serving);
  // What a worker does when it starts shutting down.
  built->server->GetHealthCheckService()->SetServingStatus(false);
  serving = CheckGrpcHealth(*channel, "", absl::Seconds(5));
  ASSERT_TRUE(serving.ok()) << serving.status();
  EXPECT_FALSE(*serving);
  // A service the server does not know.
  serving = CheckGrpcHealth(*channel, "no.such.Service", absl::Seconds(5));
  EXPECT_EQ(serving.status().code(), absl::StatusCode::kNotFound) << serving.status();
  built->server->Shutdown();
}

// A client that names the identity it wants (TlsOptions::server_identity) reaches a server only
// through a certificate of that role and name; every certificate tools/gen-certs makes names
// the same hosts, so the host-name check alone would accept any of them.
TEST(ServerIdentityTest, AClientReachesOnlyTheCertificateItAsksFor) {
  const std::string certs = testing::MakeTestCerts("server-identity-certs", /*workers=*/2);
  ASSERT_FALSE(certs.empty()) << "tools/gen-certs (run from the source tree) failed";
  auto serve_as = [&](const std::string& name) {
    return StartGrpcServer({.tls = {.cert_file = absl::StrCat(certs, "/", name, ".crt"),
                                    .key_file = absl::StrCat(certs, "/", name, ".key"),
                                    .ca_file = certs + "/ca.crt"},
                            .reflection = true},
                           {});
  };
  // gRPC health is open to any peer that completes the handshake: what it answers shows whether
  // the client's check let the handshake finish.
  auto reaches = [&](int port, std::optional<PeerIdentity> wanted) {
    TlsOptions tls{.cert_file = certs + "/router-0.crt",
                   .key_file = certs + "/router-0.key",
                   .ca_file = certs + "/ca.crt",
                   .server_identity = std::move(wanted)};
    auto channel = MakeChannel(absl::StrCat("localhost:", port), tls);
    EXPECT_TRUE(channel.ok()) << channel.status();
    if (!channel.ok()) return absl::StatusCode::kInternal;
    return CheckGrpcHealth(*channel, "", absl::Seconds(10)).status().code();
  };
  auto worker0 = serve_as("worker-0");
  ASSERT_TRUE(worker0.ok()) << worker0.status();
  auto router0 = serve_as("router-0");
  ASSERT_TRUE(router0.ok()) << router0.status();
  const PeerIdentity worker_0{std::string(kRoleWorker), "worker-0"};
  const PeerIdentity any_worker{std::string(kRoleWorker), ""};
  const PeerIdentity worker_1{std::string(kRoleWorker), "worker-1"};

  EXPECT_EQ(reaches(worker0->port, worker_0), absl::StatusCode::kOk);
  EXPECT_EQ(reaches(worker0->port, any_worker), absl::StatusCode::kOk);
  EXPECT_EQ(reaches(worker0->port, std::nullopt), absl::StatusCode::kOk);
  EXPECT_EQ(reaches(worker0->port, worker_1), absl::StatusCode::kUnavailable);
  // A router's certificate names the same hosts: only the identity check refuses it.
  EXPECT_EQ(reaches(router0->port, std::nullopt), absl::StatusCode::kOk);
  EXPECT_EQ(reaches(router0->port, any_worker), absl::StatusCode::kUnavailable);
  EXPECT_EQ(reaches(router0->port, worker_0), absl::StatusCode::kUnavailable);
  // kvdir's certificate is kvdir's: what KvdirClientTls asks for, which no other role passes.
  auto kvdir = serve_as("kvdir");
  ASSERT_TRUE(kvdir.ok()) << kvdir.status();
  const std::optional<PeerIdentity> any_kvdir = KvdirClientTls({}).server_identity;
  ASSERT_TRUE(any_kvdir.has_value());
  EXPECT_EQ(reaches(kvdir->port, any_worker), absl::StatusCode::kUnavailable);
  EXPECT_EQ(reaches(kvdir->port, any_kvdir), absl::StatusCode::kOk);
  EXPECT_EQ(reaches(worker0->port, any_kvdir), absl::StatusCode::kUnavailable);
  EXPECT_EQ(reaches(router0->port, any_kvdir), absl::StatusCode::kUnavailable);
  for (auto* built : {&*worker0, &*router0, &*kvdir}) built->server->Shutdown();
}

// A port in use is refused, as any server's second bind is: with gRPC's default SO_REUSEPORT a
// second process started on it, and the kernel gave it a share of the first one's connections.
// Both wildcard and loopback addresses are in use once the first server holds them.
TEST(StartGrpcServerTest, APortInUseIsRefused) {
  for (const char* host : {"127.0.0.1", "0.0.0.0"}) {
    SCOPED_TRACE(host);
    auto first =
        StartGrpcServer({.listen_address = absl::StrCat(host, ":0"), .reflection = true}, {});
    ASSERT_TRUE(first.ok()) << first.status();
    const std::string taken = absl::StrCat(host, ":", first->port);
    auto second = StartGrpcServer({.listen_address = taken, .reflection = true}, {});
    ASSERT_FALSE(second.ok()) << "a second server started on " << taken;
    EXPECT_EQ(second.status().message(), "cannot listen on " + taken);
    first->server->Shutdown(absl::ToChronoTime(absl::Now()));
    // Free again, the port can be bound.
    auto again = StartGrpcServer({.listen_address = taken, .reflection = true}, {});
    EXPECT_TRUE(again.ok()) << again.status();
    if (again.ok()) again->server->Shutdown(absl::ToChronoTime(absl::Now()));
  }
}

// One row of a table of TLS file sets a server must refuse: the files, and the refusal's message
// (it names the field and the path), whole or how it begins.
struct RefusedFiles {
  std::string cert, key, ca, message;
};

void ExpectStartRefused(const std::vector<RefusedFiles>& cases, bool whole_message = false) {
  for (const RefusedFiles& c : cases) {
    SCOPED_TRACE(c.message);
    auto server =
        StartGrpcServer({.listen_address = "127.0.0.1:0",
                         .tls = {.cert_file = c.cert, .key_file = c.key, .ca_file = c.ca}},
                        {});
    ASSERT_FALSE(server.ok());
    EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(whole_message ? server.status().message()
                            : server.status().message().substr(0, c.message.size()),
              c.message)
        << server.status();
  }
}

// A TLS file that is empty, not a regular file or holds no PEM block of its kind is refused
// naming the field and the path, before gRPC sees it: gRPC aborts the process on an empty
// certificate or key (an assertion), and reads a directory as empty.
TEST(StartGrpcServerTest, UnusableTlsFilesAreRefusedNamingThem) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/tls-files-", getpid());
  ASSERT_EQ(std::system(absl::StrCat("mkdir -p '", dir, "/folder'").c_str()), 0);
  auto write = [&](const std::string& name, const std::string& text) {
    const std::string path = absl::StrCat(dir, "/", name);
    std::ofstream(path) << text;
    return path;
  };
  const std::string empty = write("empty.pem", "");
  const std::string cert =
      write("cert.pem", "-----BEGIN CERTIFICATE-----\nAA==\n-----END CERTIFICATE-----\n");
  const std::string key =
      write("key.pem", "-----BEGIN PRIVATE KEY-----\nAA==\n-----END PRIVATE KEY-----\n");
  const std::string text = write("text.pem", "not a pem file\n");
  const std::string folder = dir + "/folder";
  // Hostile paths: a FIFO (a read would wait for a writer, start-up and its stop signals with
  // it) and a symbolic link to itself.
  const std::string fifo = dir + "/fifo.pem", loop = dir + "/loop.pem";
  std::remove(fifo.c_str());
  std::remove(loop.c_str());
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  ASSERT_EQ(symlink(loop.c_str(), loop.c_str()), 0);
  ExpectStartRefused({
      {empty, key, cert, "server.tls.cert_file: " + empty + " is empty"},
      {folder, key, cert, "server.tls.cert_file: cannot read " + folder + ": not a regular file"},
      {cert, empty, cert, "server.tls.key_file: " + empty + " is empty"},
      {cert, cert, cert, "server.tls.key_file: " + cert + " holds no matching PEM block"},
      {cert, key, "/dev/zero", "server.tls.ca_file: cannot read /dev/zero: not a regular file"},
      {cert, key, text, "server.tls.ca_file: " + text + " holds no matching PEM block"},
      {cert, key, key, "server.tls.ca_file: " + key + " holds no matching PEM block"},
      {fifo, key, cert, "server.tls.cert_file: cannot read " + fifo + ": not a regular file"},
      {cert, loop, cert, "server.tls.key_file: cannot read " + loop + ": "},
  });
  // A client's CA likewise (the CLI's --ca).
  auto channel = MakeChannel("127.0.0.1:9", {.ca_file = folder});
  ASSERT_FALSE(channel.ok());
  EXPECT_EQ(channel.status().message(),
            "tls.ca_file: cannot read " + folder + ": not a regular file");
}

// Files that look like PEM but do not hold a usable pair: a certificate that does not parse, a
// key that is not the certificate's (gRPC would start and fail every handshake), a CA that does
// not parse.
TEST(StartGrpcServerTest, AKeyThatIsNotTheCertificatesIsRefused) {
  const std::string certs = testing::MakeTestCerts("tls-pair-certs");
  ASSERT_FALSE(certs.empty()) << "tools/gen-certs (run from the source tree) failed";
  const std::string garbage = certs + "/garbage.pem";
  std::ofstream(garbage) << "-----BEGIN CERTIFICATE-----\nAA==\n-----END CERTIFICATE-----\n"
                         << "-----BEGIN PRIVATE KEY-----\nAA==\n-----END PRIVATE KEY-----\n";
  const std::string kvdir_crt = certs + "/kvdir.crt", kvdir_key = certs + "/kvdir.key";
  const std::string router_key = certs + "/router-0.key", ca = certs + "/ca.crt";
  ExpectStartRefused(
      {
          {kvdir_crt, router_key, ca,
           "server.tls.key_file: " + router_key +
               " is not the private key of server.tls.cert_file " + kvdir_crt},
          {garbage, kvdir_key, ca,
           "server.tls.cert_file: " + garbage + ": its first certificate does not parse"},
          {kvdir_crt, garbage, ca,
           "server.tls.key_file: " + garbage +
               ": the private key does not parse (or is encrypted)"},
          {kvdir_crt, kvdir_key, garbage,
           "server.tls.ca_file: " + garbage + ": its first certificate does not parse"},
      },
      /*whole_message=*/true);
  // Reflection: a server needs one service to start.
  auto good =
      StartGrpcServer({.listen_address = "127.0.0.1:0",
                       .tls = {.cert_file = kvdir_crt, .key_file = kvdir_key, .ca_file = ca},
                       .reflection = true},
                      {});
  ASSERT_TRUE(good.ok()) << good.status();
  good->server->Shutdown(absl::ToChronoTime(absl::Now()));
}

// Ports gRPC would not use as written are refused: it takes 99999 modulo 65536 (34463) and an
// address without a port as 443.
TEST(CheckAddressPortTest, OnlyPortsGrpcUsesAsWrittenPass) {
  for (const char* ok :
       {"127.0.0.1:7000", "host:1", "host:65535", "[::1]:7000", "dns:///w-0:7200",
        "dns://10.0.0.1/w-0:7200", "ipv4:10.0.0.5:80", "ipv4:10.0.0.1:7100,10.0.0.2:7100",
        "ipv6:[::1]:7100", "unix:/tmp/sock", "unix-abstract:name"}) {
    EXPECT_TRUE(CheckAddressPort(ok, /*listening=*/false).ok()) << ok;
  }
  EXPECT_TRUE(CheckAddressPort("127.0.0.1:0", /*listening=*/true).ok());
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"127.0.0.1:99999", "the port must be a number from 1 to 65535, got \"99999\""},
      {"127.0.0.1:65536", "the port must be a number from 1 to 65535, got \"65536\""},
      {"127.0.0.1:0", "the port must be a number from 1 to 65535, got \"0\""},
      {"127.0.0.1:http", "the port must be a number from 1 to 65535, got \"http\""},
      {"127.0.0.1:", "the port must be a number from 1 to 65535, got \"\""},
      {"127.0.0.1", "expected HOST:PORT, the port is missing"},
      {"[::1]", "expected [IPV6]:PORT, the port is missing"},
      {"::1:7000", "an IPv6 address needs brackets: [IPV6]:PORT"},
      {"dns:///w-0", "expected HOST:PORT, the port is missing"},
      {"ipv4:10.0.0.1:7100,10.0.0.2:99999",
       "10.0.0.2:99999: the port must be a number from 1 to 65535, got \"99999\""},
  };
  for (const auto& [address, why] : bad) {
    const absl::Status s = CheckAddressPort(address, /*listening=*/false);
    EXPECT_EQ(s.message(), address + ": " + why) << address;
  }
  auto server = StartGrpcServer({.listen_address = "127.0.0.1:99999"}, {});
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().message(),
            "cannot listen on 127.0.0.1:99999: the port must be a number from 0 to 65535, got "
            "\"99999\"");
  auto channel = MakeChannel("127.0.0.1", {});
  ASSERT_FALSE(channel.ok());
  EXPECT_EQ(channel.status().message(),
            "cannot dial 127.0.0.1: expected HOST:PORT, the port is missing");
}

TEST(CheckGrpcHealthTest, NothingListeningIsAnErrorWithinTheTimeout) {
  // Port 9 (discard) on loopback: nothing listens there in a test environment.
  auto channel = MakeChannel("127.0.0.1:9", {});
  ASSERT_TRUE(channel.ok()) << channel.status();
  const absl::Time start = absl::Now();
  auto serving = CheckGrpcHealth(*channel, "", absl::Milliseconds(500));
  EXPECT_FALSE(serving.ok());
  EXPECT_TRUE(serving.status().code() == absl::StatusCode::kUnavailable ||
              serving.status().code() == absl::StatusCode::kDeadlineExceeded)
      << serving.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

}  // namespace
}  // namespace lazyattn
