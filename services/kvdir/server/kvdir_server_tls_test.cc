// Under mutual TLS a worker publishes only an address its own certificate could serve: the host
// a router would dial must be among the certificate's DNS and IP names, as the router's TLS check
// will demand; a local address only from a worker connected over loopback. Otherwise any valid
// worker certificate could take another worker's address first (kvdir keeps one live worker per
// address, so the owner would be refused) or claim documents under it.
#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <prometheus/metric_family.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/certificate_names.h"
#include "common/grpc_util.h"
#include "common/test_certs_for_test.h"
#include "common/tls_expiry_metrics.h"
#include "common/tls_files.h"
#include "services/kvdir/server/kvdir_server.h"
#include "services/kvdir/server/kvdir_server_test_fixture.h"

namespace lazyattn::kvdir {
namespace {

using lazyattn::testing::ReadWholeFile;
using testing::FakeWorker;
using ::testing::HasSubstr;

class KvdirServerTlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // A folder per test: the TLS file mirrors (tls_files.h) of a process are shared by path, and
    // one made by an earlier test would keep serving that test's CA.
    certs_ = absl::StrCat(::testing::TempDir(), "/kvdir-tls-certs-",
                          ::testing::UnitTest::GetInstance()->current_test_info()->name(), "-",
                          getpid());
    // worker-0 and worker-1 name localhost and 127.0.0.1 only; worker-2 also a DNS name and an
    // address of its own, as a worker's certificate in a deployment does.
    ASSERT_EQ(std::system(absl::StrCat("tools/gen-certs --out '", certs_,
                                       "' --workers 2 --force >/dev/null && tools/gen-certs cert "
                                       "worker worker-2 --out '",
                                       certs_,
                                       "' --host worker-2.lazyattn.test --host 10.9.8.7 >/dev/null")
                              .c_str()),
              0)
        << "tools/gen-certs (run from the source tree) failed";
    StartKvdir("127.0.0.1:0");
  }

  // (Re)starts server_ with kvdir's certificate, listening on `listen`.
  void StartKvdir(const std::string& listen) {
    server_.reset();
    KvdirOptions options;
    options.listen_address = listen;
    options.metrics_address = "";
    options.tls = TlsOptions{.cert_file = certs_ + "/kvdir.crt",
                             .key_file = certs_ + "/kvdir.key",
                             .ca_file = certs_ + "/ca.crt"};
    auto server = KvdirServer::Create(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }

  // A stub presenting `worker`'s certificate, dialling kvdir at `host` (verified as localhost,
  // the one name kvdir's certificate has besides 127.0.0.1).
  std::unique_ptr<v1::KvDirectory::Stub> StubAs(const std::string& worker,
                                                const std::string& host = "localhost") {
    grpc::ChannelArguments args;
    if (host != "localhost") args.SetSslTargetNameOverride("localhost");
    auto channel = MakeChannel(absl::StrCat(host, ":", server_->port()),
                               TlsOptions{.cert_file = certs_ + "/" + worker + ".crt",
                                          .key_file = certs_ + "/" + worker + ".key",
                                          .ca_file = certs_ + "/ca.crt"},
                               64 << 20, nullptr, std::move(args));
    EXPECT_TRUE(channel.ok()) << channel.status();
    return v1::KvDirectory::NewStub(*channel);
  }

  // The stream's end after a hello of `worker` advertising `address`, made by dialling kvdir at
  // `host`: OK when kvdir took it (its lease grant came), else the status that ended it.
  grpc::Status HelloAs(const std::string& worker, const std::string& address,
                       const std::string& host = "localhost") {
    auto stub = StubAs(worker, host);
    FakeWorker w(stub.get(), worker);
    EXPECT_TRUE(w.Hello(1, address));
    v1::DirectoryMessage m;
    if (w.Read(&m) && m.has_lease()) return grpc::Status::OK;
    return w.Drain();
  }

  // lazyattn_kvdir_hellos_refused_total{reason}; -1 when the series is missing.
  double Refused(const std::string& reason) {
    for (const prometheus::MetricFamily& f : server_->registry()->Collect()) {
      if (f.name != "lazyattn_kvdir_hellos_refused_total") continue;
      for (const auto& m : f.metric) {
        for (const auto& l : m.label) {
          if (l.name == "reason" && l.value == reason) return m.counter.value;
        }
      }
    }
    return -1;
  }

  // lazyattn_tls_certificate_expiry_timestamp_seconds{role="server",file}; -1 when missing.
  double Expiry(const std::string& file) {
    for (const prometheus::MetricFamily& f : server_->registry()->Collect()) {
      if (f.name != kTlsExpiryMetric) continue;
      for (const auto& m : f.metric) {
        int matched = 0;
        for (const auto& l : m.label) {
          matched +=
              (l.name == "role" && l.value == "server") || (l.name == "file" && l.value == file);
        }
        if (matched == 2) return m.gauge.value;
      }
    }
    return -1;
  }

  std::string certs_;
  std::unique_ptr<KvdirServer> server_;
};

// kvdir exports when its certificate and its CA expire (alert LazyattnTlsCertificateExpiresSoon).
TEST_F(KvdirServerTlsTest, ExportsItsCertificatesExpiry) {
  for (const auto& [file, path] :
       {std::pair<std::string, std::string>{"cert", "/kvdir.crt"}, {"ca", "/ca.crt"}}) {
    const absl::StatusOr<int64_t> not_after = CertificateNotAfter(ReadWholeFile(certs_ + path));
    ASSERT_TRUE(not_after.ok()) << not_after.status();
    EXPECT_EQ(Expiry(file), static_cast<double>(*not_after)) << file;
  }
}

// kvdir does not start with another role's certificate of the CA: routers and workers accept
// only a lazyattn://kvdir/ one (KvdirClientTls), so it would serve nobody. Exit status 2.
TEST_F(KvdirServerTlsTest, AnotherRolesCertificateStopsTheStart) {
  for (const auto& [cert, role] :
       {std::pair<std::string, std::string>{"worker-0", "worker"}, {"router-0", "router"}}) {
    SCOPED_TRACE(cert);
    KvdirOptions options;
    options.listen_address = "127.0.0.1:0";
    options.metrics_address = "";
    options.tls = TlsOptions{.cert_file = absl::StrCat(certs_, "/", cert, ".crt"),
                             .key_file = absl::StrCat(certs_, "/", cert, ".key"),
                             .ca_file = certs_ + "/ca.crt"};
    auto server = KvdirServer::Create(options);
    ASSERT_FALSE(server.ok());
    EXPECT_EQ(ExitStatusForStartFailure(server.status()), 2) << server.status();
    const std::string message(server.status().message());
    EXPECT_THAT(message, HasSubstr(absl::StrCat("server.tls.cert_file: ", options.tls.cert_file,
                                                ": the certificate is lazyattn://")));
    EXPECT_THAT(message, HasSubstr(absl::StrCat("lazyattn://", role, "/", cert, " (role ", role,
                                                "), but this server serves as role kvdir")));
  }
}

TEST_F(KvdirServerTlsTest, AnAddressMustBeNamedByTheWorkersCertificate) {
  // worker-1 tries worker-2's name and worker-2's address, before worker-2 has connected.
  for (const std::string address :
       {"worker-2.lazyattn.test:7200", "dns:///worker-2.lazyattn.test:7200", "10.9.8.7:7200"}) {
    SCOPED_TRACE(address);
    const grpc::Status refused = HelloAs("worker-1", address);
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::PERMISSION_DENIED) << refused.error_message();
    EXPECT_THAT(refused.error_message(), HasSubstr("hello.status.address"));
    EXPECT_THAT(refused.error_message(), HasSubstr("DNS:localhost, IP:127.0.0.1"));
  }
  EXPECT_EQ(Refused("address_not_in_certificate"), 3);
  // An address of no host a certificate could name.
  const grpc::Status no_host = HelloAs("worker-0", "xds:///worker-0");
  EXPECT_EQ(no_host.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(no_host.error_message(), HasSubstr("has no host"));
  EXPECT_EQ(Refused("address_not_in_certificate"), 4);
  // A local socket passes a certificate check as "localhost", which every certificate of
  // tools/gen-certs names; a DNS server picked by the address decides where its host resolves;
  // a host spelled so that resolvers read it differently says nothing certain of where it
  // connects. Each would send every router wherever the worker points.
  for (const std::string address :
       {"unix:/var/run/docker.sock", "unix-abstract:x", "dns://203.0.113.9:53/localhost:7000",
        "127.1:7000", "[::1%25lo]:7000"}) {
    SCOPED_TRACE(address);
    const grpc::Status refused = HelloAs("worker-0", address);
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::PERMISSION_DENIED) << refused.error_message();
    EXPECT_THAT(refused.error_message(),
                HasSubstr("is a local socket, names its own DNS server or spells its host "
                          "ambiguously"));
  }
  EXPECT_EQ(Refused("address_not_in_certificate"), 4);
  EXPECT_EQ(Refused("address_not_dialable"), 5);

  // The owners are taken, by any form of a name their certificates hold; worker-1's attempts left
  // nothing behind that would refuse worker-2 its address.
  EXPECT_TRUE(HelloAs("worker-2", "WORKER-2.lazyattn.test.:7200").ok());
  EXPECT_TRUE(HelloAs("worker-0", "localhost:7000").ok());
  EXPECT_TRUE(HelloAs("worker-1", "[127.0.0.1]:7001").ok());
  EXPECT_EQ(Refused("address_not_in_certificate"), 4);
  EXPECT_EQ(Refused("address_not_dialable"), 5);
  EXPECT_EQ(Refused("address_in_use"), 0);
}

// A non-loopback IPv4 address of this machine, "" when it has none.
std::string NonLoopbackAddress() {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return "";
  std::string found;
  for (ifaddrs* a = list; a != nullptr && found.empty(); a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    char text[INET_ADDRSTRLEN] = {};
    const auto* in = reinterpret_cast<const sockaddr_in*>(a->ifa_addr);
    if (inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text)) != nullptr && !IsLocalHost(text)) {
      found = text;
    }
  }
  freeifaddrs(list);
  return found;
}

// A worker connected from another host may not advertise a local address (localhost, 127.0.0.1,
// 0.0.0.0), though every tools/gen-certs certificate names localhost and 127.0.0.1: each router
// would dial its own host (its other services' ports). Over loopback (a one-machine cluster, as
// above) it may. Here the worker reaches kvdir by this machine's own non-loopback address, so
// kvdir sees it connect from that address.
TEST_F(KvdirServerTlsTest, AWorkerFromAnotherHostMayNotAdvertiseALocalAddress) {
  const std::string own = NonLoopbackAddress();
  if (own.empty()) GTEST_SKIP() << "this machine has no non-loopback IPv4 address to connect by";
  StartKvdir("0.0.0.0:0");
  for (const char* address : {"localhost:7000", "127.0.0.1:2379", "0.0.0.0:7000", "[::1]:7000"}) {
    SCOPED_TRACE(address);
    const grpc::Status refused = HelloAs("worker-0", address, own);
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::PERMISSION_DENIED) << refused.error_message();
    EXPECT_THAT(refused.error_message(), HasSubstr("is the dialler's own host"));
  }
  EXPECT_EQ(Refused("address_not_dialable"), 4);
  EXPECT_EQ(Refused("address_not_in_certificate"), 0);
  // Over loopback the same worker may.
  EXPECT_TRUE(HelloAs("worker-0", "127.0.0.1:7000").ok());
}

}  // namespace
}  // namespace lazyattn::kvdir
