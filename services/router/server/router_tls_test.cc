// The router's TLS and API key edge over real gRPC: per-key limits through the whole call path
// (RESOURCE_EXHAUSTED naming the key's name, following reloads of the key file, revocation) and
// certificate rotation without a restart (new connections get the new certificate, a stream
// opened before keeps working). Certificates come from tools/gen-certs (run from the source tree,
// as ctest does); the router reaches a scripted fake worker in plaintext.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <prometheus/text_serializer.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/document_key.h"
#include "common/grpc_util.h"
#include "common/monotonic_time.h"
#include "common/test_certs_for_test.h"
#include "common/tls_expiry_metrics.h"
#include "common/tls_files.h"
#include "lazyattn/v1/inference.grpc.pb.h"
#include "services/router/server/fake_cluster_for_test.h"
#include "services/router/server/router_server.h"
#include "services/router/server/worker_registry.h"

namespace lazyattn::router {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using testing::WaitFor;

using lazyattn::testing::ReadWholeFile;

void WriteFile(const std::string& path, const std::string& text) {
  // Written beside and renamed over, as an operator (or a Kubernetes Secret update) replaces it.
  const std::string tmp = path + ".tmp";
  std::ofstream(tmp) << text;
  std::filesystem::rename(tmp, path);
}

// `openssl x509 -serial` of a PEM certificate ("" on failure).
std::string Serial(const std::string& pem) {
  // Per process: ctest may run this binary's tests side by side.
  const std::string path = absl::StrCat(::testing::TempDir(), "/serial-probe-", getpid(), ".pem");
  std::ofstream(path) << pem;
  FILE* p = popen(("openssl x509 -noout -serial -in '" + path + "' 2>/dev/null").c_str(), "r");
  if (p == nullptr) return "";
  char buf[256] = {};
  const size_t n = fread(buf, 1, sizeof(buf) - 1, p);
  pclose(p);
  return std::string(absl::StripAsciiWhitespace(absl::string_view(buf, n)));
}

class RouterTlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    certs_ = lazyattn::testing::MakeTestCerts("router-tls-certs");
    ASSERT_FALSE(certs_.empty()) << "tools/gen-certs (run from the source tree) failed";
    std::filesystem::copy_file(certs_ + "/router-0.crt", certs_ + "/live.crt",
                               std::filesystem::copy_options::overwrite_existing);
    std::filesystem::copy_file(certs_ + "/router-0.key", certs_ + "/live.key",
                               std::filesystem::copy_options::overwrite_existing);
    keys_file_ = certs_ + "/keys.yaml";
    worker_.Start();
  }

  void StartRouter(const std::string& keys_yaml) {
    WriteFile(keys_file_, keys_yaml);
    RouterOptions o;
    o.server.listen_address = "127.0.0.1:0";
    o.server.tls = TlsOptions{.cert_file = certs_ + "/live.crt",
                              .key_file = certs_ + "/live.key",
                              .refresh_interval_s = 1};
    o.workers = {worker_.address()};
    o.kvdir.refresh_interval = absl::Hours(1);
    o.health.interval = absl::ZeroDuration();
    o.auth.api_keys_file = keys_file_;
    o.auth.reload_interval = absl::Milliseconds(50);
    registry_ = std::make_shared<prometheus::Registry>();
    auto server = RouterServer::Create(o, registry_);
    ASSERT_TRUE(server.ok()) << server.status();
    router_ = std::move(*server);
  }

  // A channel of its own (its own connection: no subchannel shared with other channels).
  std::unique_ptr<lazyattn::v1::Inference::Stub> Stub(const std::string& key) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = ReadWholeFile(certs_ + "/ca.crt");
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    auto creds = grpc::CompositeChannelCredentials(grpc::SslCredentials(ssl),
                                                   grpc::AccessTokenCredentials(key));
    return lazyattn::v1::Inference::NewStub(grpc::CreateCustomChannel(
        absl::StrCat("localhost:", router_->port()), creds, args));
  }

  static lazyattn::v1::GenerateRequest Request() {
    lazyattn::v1::GenerateRequest r;
    r.set_question("What is it?");
    return r;
  }

  // GetModelInfo's status, and the serial of the certificate the router presented.
  grpc::Status Info(lazyattn::v1::Inference::Stub& stub, std::string* serial = nullptr) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    lazyattn::v1::ModelInfo info;
    grpc::Status s = stub.GetModelInfo(&ctx, {}, &info);
    if (serial != nullptr) {
      serial->clear();
      if (auto auth = ctx.auth_context()) {
        for (const auto& v : auth->FindPropertyValues(GRPC_X509_PEM_CERT_PROPERTY_NAME)) {
          *serial = Serial(std::string(v.data(), v.size()));
        }
      }
    }
    return s;
  }

  std::string Metrics() const {
    return prometheus::TextSerializer().Serialize(registry_->Collect());
  }

  // The certificate expiry series of `role` and `file` (tls_expiry_metrics.h); -1 when absent.
  double Expiry(const std::string& role, const std::string& file) const {
    for (const prometheus::MetricFamily& family : registry_->Collect()) {
      if (family.name != kTlsExpiryMetric) continue;
      for (const prometheus::ClientMetric& m : family.metric) {
        int matched = 0;
        for (const auto& l : m.label) {
          matched += (l.name == "role" && l.value == role) || (l.name == "file" && l.value == file);
        }
        if (matched == 2) return m.gauge.value;
      }
    }
    return -1;
  }

  // One Generate stream read to its end on its own thread.
  struct Stream {
    grpc::ClientContext ctx;
    std::unique_ptr<grpc::ClientReader<lazyattn::v1::GenerateResponse>> reader;
    int tokens = 0;
    grpc::Status status;
    std::thread thread;
  };
  std::unique_ptr<Stream> Open(lazyattn::v1::Inference::Stub& stub) {
    auto s = std::make_unique<Stream>();
    s->ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
    s->reader = stub.Generate(&s->ctx, Request());
    s->thread = std::thread([s = s.get()] {
      lazyattn::v1::GenerateResponse r;
      while (s->reader->Read(&r)) s->tokens += r.has_token() ? 1 : 0;
      s->status = s->reader->Finish();
    });
    return s;
  }

  std::string certs_;
  std::string keys_file_;
  testing::FakeWorker worker_{"w0"};
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<RouterServer> router_;  // destroyed before the worker
};

std::string KeyEntry(const std::string& name, const std::string& key, const std::string& limits) {
  return absl::StrCat("  - name: ", name, "\n    sha256: ", Sha256Hex(key),
                      "\n    scopes: [generate]\n", limits.empty() ? "" : "    limits: " + limits,
                      limits.empty() ? "" : "\n");
}

// Each key's cache namespace (its name unless the key file groups keys under one) reaches the
// worker with every Generate, Complete and Prefetch call it makes; a client cannot choose another
// key's by sending the metadata itself, and its own cache_salt travels in the request.
TEST_F(RouterTlsTest, EachKeysCacheNamespaceReachesTheWorker) {
  const std::string alone = "lzk_alone", first = "lzk_first", second = "lzk_second";
  StartRouter(absl::StrCat("keys:\n  - name: alone\n    sha256: ", Sha256Hex(alone),
                           "\n    scopes: [generate, admin]\n") +
              KeyEntry("first", first, "") + "    cache_namespace: acme\n" +
              KeyEntry("second", second, "") + "    cache_namespace: acme\n");
  for (const std::string& key : {alone, first, second}) {
    auto stub = Stub(key);
    grpc::ClientContext ctx;
    ctx.AddMetadata(kCacheNamespaceMetadata, "forged");  // not passed on
    lazyattn::v1::GenerateRequest request = Request();
    request.set_cache_salt("user-7");
    lazyattn::v1::CompleteResponse response;
    const grpc::Status s = stub->Complete(&ctx, request, &response);
    EXPECT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(worker_.last_request().cache_salt(), "user-7");
  }
  auto stub = Stub(alone);
  auto stream = Open(*stub);
  stream->thread.join();
  EXPECT_TRUE(stream->status.ok()) << stream->status.error_message();
  grpc::ClientContext ctx;
  lazyattn::v1::PrefetchRequest prefetch;
  prefetch.add_documents()->set_text("the manual");
  lazyattn::v1::PrefetchResponse prefetched;
  const grpc::Status s = stub->Prefetch(&ctx, prefetch, &prefetched);
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(worker_.cache_namespaces(),
            (std::vector<std::string>{"alone", "acme", "acme", "alone", "alone"}));
}

TEST_F(RouterTlsTest, PerKeyLimitsNameTheKeyAndFollowReloads) {
  testing::FakeWorker::Script script;
  script.block = true;
  worker_.SetScript(script);
  const std::string limited = "lzk_limited_secret", rated = "lzk_rated_secret";
  StartRouter("keys:\n" + KeyEntry("limited", limited, "{max_in_flight: 1}") +
              KeyEntry("rated", rated, "{requests_per_second: 0.01, burst: 2}"));
  auto limited_stub = Stub(limited);
  auto rated_stub = Stub(rated);

  // In flight: the first call holds the key's one place until it ends.
  auto first = Open(*limited_stub);
  ASSERT_TRUE(worker_.WaitForCalls(1, absl::Seconds(10)));
  grpc::ClientContext ctx;
  lazyattn::v1::CompleteResponse response;
  grpc::Status s = limited_stub->Complete(&ctx, Request(), &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("API key \"limited\": 1 requests in flight"));
  EXPECT_THAT(s.error_message(), Not(HasSubstr(limited)));  // the name, never the key
  // Another key is not affected by it; its own rate allows a burst of 2, then refuses.
  EXPECT_TRUE(Info(*rated_stub).ok());
  EXPECT_TRUE(Info(*rated_stub).ok());
  s = Info(*rated_stub);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("API key \"rated\": over its request rate"));

  // Reload with a higher cap and no rate limit: a second call of `limited` now runs.
  WriteFile(keys_file_, "keys:\n" + KeyEntry("limited", limited, "{max_in_flight: 2}") +
                            KeyEntry("rated", rated, ""));
  ASSERT_TRUE(WaitFor([&] { return Info(*rated_stub).ok(); })) << "the reload never came";
  auto second = Open(*limited_stub);
  ASSERT_TRUE(worker_.WaitForCalls(2, absl::Seconds(10)));
  grpc::ClientContext ctx3;
  s = limited_stub->Complete(&ctx3, Request(), &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("API key \"limited\": 2 requests in flight"));

  // Revoked: new calls are UNAUTHENTICATED; the calls already running finish normally.
  WriteFile(keys_file_, "keys:\n" + KeyEntry("rated", rated, ""));
  ASSERT_TRUE(WaitFor([&] {
    return Info(*limited_stub).error_code() == grpc::StatusCode::UNAUTHENTICATED;
  }));
  worker_.Unblock();
  for (auto* stream : {first.get(), second.get()}) {
    stream->thread.join();
    EXPECT_TRUE(stream->status.ok()) << stream->status.error_message();
    EXPECT_EQ(stream->tokens, 3);
  }
  const std::string m = Metrics();
  EXPECT_THAT(m, HasSubstr("lazyattn_router_api_key_limited_total{key=\"limited\","
                           "limit=\"in_flight\"} 2"));
  // At least the one refusal above (the wait for the reload may have added more).
  EXPECT_THAT(m, HasSubstr("lazyattn_router_api_key_limited_total{key=\"rated\",limit=\"rate\"} "));
  EXPECT_THAT(m, Not(HasSubstr("lazyattn_router_api_key_limited_total{key=\"rated\","
                               "limit=\"rate\"} 0\n")));
}

TEST_F(RouterTlsTest, ARotatedCertificateServesNewConnectionsAndOldStreamsKeepWorking) {
  testing::FakeWorker::Script script;
  script.block = true;
  worker_.SetScript(script);
  const std::string key = "lzk_demo_secret";
  StartRouter("keys:\n" + KeyEntry("demo", key, ""));
  const std::string old_serial = Serial(ReadWholeFile(certs_ + "/router-0.crt"));
  ASSERT_FALSE(old_serial.empty());
  auto old_stub = Stub(key);
  std::string serial;
  ASSERT_TRUE(Info(*old_stub, &serial).ok());
  EXPECT_EQ(serial, old_serial);
  auto stream = Open(*old_stub);  // open across the rotation
  ASSERT_TRUE(worker_.WaitForCalls(1, absl::Seconds(10)));
  // The certificate's expiry on /metrics; no CA and no client side are configured: no series.
  const absl::StatusOr<int64_t> old_expiry =
      CertificateNotAfter(ReadWholeFile(certs_ + "/router-0.crt"));
  ASSERT_TRUE(old_expiry.ok()) << old_expiry.status();
  EXPECT_EQ(Expiry("server", "cert"), static_cast<double>(*old_expiry));
  EXPECT_EQ(Expiry("server", "ca"), -1);
  EXPECT_EQ(Expiry("client", "cert"), -1);

  // A new certificate from the same CA (valid longer than gen-certs' 30 days, so that its
  // expiry differs), moved over the files the router was started with.
  ASSERT_EQ(std::system(absl::StrCat("tools/gen-certs cert router router-0-next --days 45 --out '",
                                     certs_, "' >/dev/null")
                            .c_str()),
            0);
  const absl::StatusOr<int64_t> new_expiry =
      CertificateNotAfter(ReadWholeFile(certs_ + "/router-0-next.crt"));
  ASSERT_TRUE(new_expiry.ok()) << new_expiry.status();
  ASSERT_GT(*new_expiry, *old_expiry);
  const std::string new_serial = Serial(ReadWholeFile(certs_ + "/router-0-next.crt"));
  ASSERT_FALSE(new_serial.empty());
  ASSERT_NE(new_serial, old_serial);
  std::filesystem::rename(certs_ + "/router-0-next.key", certs_ + "/live.key");
  std::filesystem::rename(certs_ + "/router-0-next.crt", certs_ + "/live.crt");

  // Within a few refresh intervals a new connection gets the new certificate.
  EXPECT_TRUE(WaitFor([&] {
    auto fresh = Stub(key);
    return Info(*fresh, &serial).ok() && serial == new_serial;
  })) << "still served " << serial;
  // The gauge follows the certificate served (the mirror took it up before gRPC could serve it).
  EXPECT_EQ(Expiry("server", "cert"), static_cast<double>(*new_expiry));
  // The stream opened before the rotation is still served, on its old connection.
  worker_.Unblock();
  stream->thread.join();
  EXPECT_TRUE(stream->status.ok()) << stream->status.error_message();
  EXPECT_EQ(stream->tokens, 3);
}

// The router's channel to a worker accepts only the certificate of the id the directory lists at
// that address: another worker's certificate (or a router's, which names the same hosts) is
// refused at the handshake, before any request is sent. A new id listed at the address dials
// anew with that id's check.
TEST_F(RouterTlsTest, AWorkerChannelAcceptsOnlyTheListedWorkersCertificate) {
  auto serving = StartGrpcServer({.tls = {.cert_file = certs_ + "/worker-0.crt",
                                          .key_file = certs_ + "/worker-0.key",
                                          .ca_file = certs_ + "/ca.crt"},
                                  .reflection = true},
                                 {});
  ASSERT_TRUE(serving.ok()) << serving.status();
  const std::string address = absl::StrCat("localhost:", serving->port);
  WorkerRegistry registry({},
                          TlsOptions{.cert_file = certs_ + "/router-0.crt",
                                     .key_file = certs_ + "/router-0.key",
                                     .ca_file = certs_ + "/ca.crt"},
                          1 << 20, absl::Seconds(60), /*directory_on_this_host=*/true);
  auto listed_as = [&](const std::string& id) {
    google::protobuf::RepeatedPtrField<lazyattn::v1::WorkerResidency> listing;
    lazyattn::v1::WorkerStatus* w = listing.Add()->mutable_worker();
    w->set_worker_id(id);
    w->set_address(address);
    registry.ObserveDirectory(listing, MonotonicNow());
    auto channel = registry.Channel(address);
    EXPECT_TRUE(channel.ok()) << channel.status();
    if (!channel.ok()) return absl::StatusCode::kInternal;
    return CheckGrpcHealth(*channel, "", absl::Seconds(10)).status().code();
  };
  EXPECT_EQ(listed_as("worker-0"), absl::StatusCode::kOk);
  EXPECT_EQ(listed_as("worker-1"), absl::StatusCode::kUnavailable);
  EXPECT_EQ(registry.kept_channels(), 1u);
  EXPECT_EQ(listed_as("worker-0"), absl::StatusCode::kOk);

  // A call planned for an id checks that id, whatever the listing says by the time it is made:
  // planned for worker-1 (listed here before), it does not reach worker-0's certificate, and
  // the kept channel stays worker-0's.
  auto status_of = [&](const std::string& planned_id) {
    auto stub = registry.Stub(address, planned_id);
    EXPECT_TRUE(stub.ok()) << stub.status();
    if (!stub.ok()) return grpc::StatusCode::INTERNAL;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    lazyattn::v1::WorkerStatus status;
    return (*stub)->Status(&ctx, lazyattn::v1::WorkerStatusRequest(), &status).error_code();
  };
  EXPECT_EQ(status_of("worker-1"), grpc::StatusCode::UNAVAILABLE);
  // The handshake passes for the planned id; the server has no Worker service (UNIMPLEMENTED).
  EXPECT_EQ(status_of("worker-0"), grpc::StatusCode::UNIMPLEMENTED);
  EXPECT_EQ(registry.kept_channels(), 1u);
  // Forgotten addresses too: a retry planned before the worker left checks the planned id.
  registry.ObserveDirectory({}, MonotonicNow() + absl::Seconds(120));
  EXPECT_EQ(registry.kept_channels(), 0u);
  EXPECT_EQ(status_of("worker-1"), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(status_of("worker-0"), grpc::StatusCode::UNIMPLEMENTED);
  serving->server->Shutdown();
}

// The router lists workers and looks documents up only at a directory whose certificate carries
// kvdir's identity (KvdirClientTls): every tools/gen-certs certificate names the same hosts, so a
// worker's would otherwise pass for kvdir and hand the router a worker list of its choosing.
TEST_F(RouterTlsTest, TheRouterAsksOnlyADirectoryWithKvdirsCertificate) {
  auto listings_served_as = [&](const std::string& cert) {
    testing::FakeKvdir kvdir;
    absl::Status started = kvdir.StartTls({.cert_file = absl::StrCat(certs_, "/", cert, ".crt"),
                                           .key_file = absl::StrCat(certs_, "/", cert, ".key"),
                                           .ca_file = certs_ + "/ca.crt"});
    EXPECT_TRUE(started.ok()) << started;
    RouterOptions o = testing::RouterOptionsForFakeKvdir(kvdir.address());
    o.client_tls = TlsOptions{.cert_file = certs_ + "/router-0.crt",
                              .key_file = certs_ + "/router-0.key",
                              .ca_file = certs_ + "/ca.crt"};
    o.kvdir.list_timeout = absl::Milliseconds(500);
    o.kvdir.refresh_interval = absl::Milliseconds(100);
    o.health.interval = absl::ZeroDuration();
    auto router = RouterServer::Create(o, std::make_shared<prometheus::Registry>());
    EXPECT_TRUE(router.ok()) << router.status();
    // Several refreshes: kvdir's certificate is listed from within the first ones.
    WaitFor([&] { return kvdir.listings() > 0; }, absl::Seconds(3));
    const int listings = kvdir.listings();
    if (router.ok()) router->reset();
    return listings;
  };
  EXPECT_GT(listings_served_as("kvdir"), 0);
  EXPECT_EQ(listings_served_as("worker-0"), 0);
  EXPECT_EQ(listings_served_as("router-0"), 0);
}

// Client TLS files that cannot serve stop the router at start, naming the key: it dials workers
// later, and would otherwise be up and SERVING with every request failing for want of a worker.
TEST_F(RouterTlsTest, ClientTlsFilesThatCannotServeStopTheRouterNamingThem) {
  const std::string empty = certs_ + "/empty.crt";
  std::ofstream(empty) << "";
  struct Case {
    TlsOptions tls;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{.ca_file = certs_ + "/missing.crt"},
       "client_tls.ca_file: cannot read " + certs_ + "/missing.crt"},
      {{.ca_file = empty}, "client_tls.ca_file: " + empty + " is empty"},
      {{.cert_file = certs_ + "/router-0.crt",
        .key_file = certs_ + "/worker-0.key",
        .ca_file = certs_ + "/ca.crt"},
       "client_tls.key_file: " + certs_ + "/worker-0.key" +
           " is not the private key of client_tls.cert_file " + certs_ + "/router-0.crt"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.message);
    RouterOptions o;
    o.server.listen_address = "127.0.0.1:0";
    o.workers = {worker_.address()};
    o.health.interval = absl::ZeroDuration();
    o.client_tls = c.tls;
    auto router = RouterServer::Create(o, std::make_shared<prometheus::Registry>());
    ASSERT_FALSE(router.ok());
    EXPECT_EQ(router.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(router.status().message().substr(0, c.message.size()), c.message) << router.status();
  }
}

}  // namespace
}  // namespace lazyattn::router
