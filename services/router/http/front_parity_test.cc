// The two fronts of one router refuse alike: for every kind of refusal before a request is
// forwarded (no key, a key without the scope, a key over its rate or its in-flight cap, the
// router's in-flight limit, an invalid request, more documents than the served model takes), the
// gRPC API (over TLS with API keys) and the HTTP API (the same router, the same key file) answer
// the same status (HTTP's mapped from gRPC's, error_mapping.h) with the same message naming the
// same field (HTTP's own JSON names, ToHttpFieldNames). Certificates come from tools/gen-certs
// (run from the source tree, as ctest does); the router reaches a scripted fake worker.
#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/document_key.h"
#include "lazyattn/v1/inference.grpc.pb.h"
#include "nlohmann/json.hpp"
#include "prometheus/text_serializer.h"
#include "services/router/http/error_mapping.h"
#include "services/router/http/http_server.h"
#include "services/router/http/openai_json.h"
#include "services/router/server/fake_cluster_for_test.h"
#include "services/router/server/router_server.h"

namespace lazyattn::router {
namespace {

using ::testing::HasSubstr;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string KeyEntry(const std::string& name, const std::string& key, const std::string& scopes,
                     const std::string& limits = "") {
  return absl::StrCat("  - name: ", name, "\n    sha256: ", Sha256Hex(key), "\n    scopes: [",
                      scopes, "]\n", limits.empty() ? "" : "    limits: " + limits + "\n");
}

// One refusal as the client sees it: the status (gRPC code, or HTTP status) and the message.
struct Refusal {
  int status = 0;
  std::string message;
  std::string param;  // HTTP: the error's `param`; gRPC: the field ParamOf finds in the message
};

class FrontParityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    certs_ = absl::StrCat(::testing::TempDir(), "/front-parity-certs-", getpid());
    ASSERT_EQ(std::system(absl::StrCat("tools/gen-certs --out '", certs_,
                                       "' --workers 1 --force >/dev/null")
                              .c_str()),
              0)
        << "tools/gen-certs (run from the source tree) failed";
    std::ofstream(certs_ + "/keys.yaml")
        << "keys:\n"
        << KeyEntry("demo", kDemo, "generate") << KeyEntry("ops", kOps, "admin")
        << KeyEntry("capped", kCapped, "generate", "{max_in_flight: 1}")
        << KeyEntry("rated", kRated, "generate", "{requests_per_second: 0.01, burst: 1}");
    worker_.Start();
    RouterOptions o;
    o.server.listen_address = "127.0.0.1:0";
    o.server.tls = TlsOptions{.cert_file = certs_ + "/router-0.crt",
                              .key_file = certs_ + "/router-0.key",
                              .refresh_interval_s = 60};
    o.workers = {worker_.address()};
    o.kvdir.refresh_interval = absl::Hours(1);
    o.health.interval = absl::ZeroDuration();
    o.auth.api_keys_file = certs_ + "/keys.yaml";
    o.max_inflight_requests = 1;
    o.limits.max_documents = 64;  // above the fake worker's 32: the model's limit is the lower
    auto server = RouterServer::Create(o, metrics_);
    ASSERT_TRUE(server.ok()) << server.status();
    router_ = std::move(*server);
    HttpOptions http;
    http.listen = "127.0.0.1:0";
    auto started =
        HttpServer::Create(http, TlsOptions{}, &router_->context(), router_->auth_processor());
    ASSERT_TRUE(started.ok()) << started.status();
    http_ = std::move(*started);
    // The model (and its document limit) is known once the worker's status was read.
    const absl::Time until = absl::Now() + absl::Seconds(10);
    while (!router_->context().registry().Model().has_value() && absl::Now() < until) {
      absl::SleepFor(absl::Milliseconds(20));
    }
    ASSERT_TRUE(router_->context().registry().Model().has_value());
  }

  void TearDown() override {
    http_.reset();
    router_.reset();
    std::filesystem::remove_all(certs_);
  }

  std::unique_ptr<lazyattn::v1::Inference::Stub> Stub(const std::string& key) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = ReadFile(certs_ + "/ca.crt");
    auto creds = grpc::SslCredentials(ssl);
    if (!key.empty()) {
      creds = grpc::CompositeChannelCredentials(creds, grpc::AccessTokenCredentials(key));
    }
    return lazyattn::v1::Inference::NewStub(
        grpc::CreateChannel(absl::StrCat("localhost:", router_->port()), creds));
  }

  // Complete over gRPC with `key` ("" none).
  Refusal Grpc(const std::string& key, const lazyattn::v1::GenerateRequest& request) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
    lazyattn::v1::CompleteResponse response;
    const grpc::Status s = Stub(key)->Complete(&ctx, request, &response);
    return {static_cast<int>(s.error_code()), s.error_message(), ParamOf(s.error_message())};
  }

  // POST /v1/chat/completions with `key` ("" none) and the JSON `body`.
  Refusal Http(const std::string& key, const std::string& body) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(http_->port()));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    timeval tv{20, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      close(fd);
      return {-1, "connect failed", ""};
    }
    const std::string request = absl::StrCat(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n",
        key.empty() ? "" : absl::StrCat("Authorization: Bearer ", key, "\r\n"),
        "Connection: close\r\nContent-Length: ", body.size(), "\r\n\r\n", body);
    (void)!write(fd, request.data(), request.size());
    std::string reply;
    char buf[4096];
    ssize_t n;
    while ((n = read(fd, buf, sizeof(buf))) > 0) reply.append(buf, static_cast<size_t>(n));
    close(fd);
    Refusal r;
    if (reply.rfind("HTTP/1.1 ", 0) != 0) return {-1, reply, ""};
    r.status = std::atoi(reply.c_str() + 9);
    const size_t head_end = reply.find("\r\n\r\n");
    const auto json = nlohmann::json::parse(
        head_end == std::string::npos ? "" : reply.substr(head_end + 4), nullptr, false);
    if (json.is_object() && json.contains("error")) {
      r.message = json["error"].value("message", "");
      if (json["error"]["param"].is_string()) r.param = json["error"]["param"];
    } else {
      r.message = reply;
    }
    return r;
  }

  // The router's one in-flight place (max_inflight_requests 1) is given back a moment after a
  // served call's client has its answer: waits for it, so the next request is not refused busy.
  void WaitForFreeSlot() {
    const absl::Time until = absl::Now() + absl::Seconds(10);
    while (!router_->context().TryAdmit()) {
      ASSERT_LT(absl::Now(), until) << "the router's in-flight place was never given back";
      absl::SleepFor(absl::Milliseconds(5));
    }
    router_->context().Release();
  }

  // The same refusal on both fronts: HTTP's status is gRPC's mapped, the message is gRPC's (in
  // the HTTP API's field names) and names the same field.
  void ExpectSame(const std::string& what, const Refusal& grpc_side, const Refusal& http_side,
                  grpc::StatusCode expected) {
    SCOPED_TRACE(what);
    EXPECT_EQ(grpc_side.status, static_cast<int>(expected)) << grpc_side.message;
    EXPECT_EQ(http_side.status, HttpStatusOf(expected)) << http_side.message;
    EXPECT_EQ(http_side.message, ToHttpFieldNames(ApiKind::kChat, grpc_side.message));
    EXPECT_EQ(http_side.param, ParamOf(http_side.message));
  }

  static lazyattn::v1::GenerateRequest Request(int documents = 0) {
    lazyattn::v1::GenerateRequest r;
    auto* m = r.add_messages();
    m->set_role("user");
    m->set_content("What is it?");
    r.set_chat(true);
    for (int i = 0; i < documents; ++i) r.add_documents()->set_text(absl::StrCat("doc ", i));
    r.mutable_sampling()->set_max_tokens(4);
    return r;
  }
  static std::string Body(int documents = 0) {
    nlohmann::json body = {{"messages", {{{"role", "user"}, {"content", "What is it?"}}}},
                           {"max_tokens", 4}};
    if (documents > 0) {
      body["documents"] = nlohmann::json::array();
      for (int i = 0; i < documents; ++i) {
        body["documents"].push_back({{"text", absl::StrCat("doc ", i)}});
      }
    }
    return body.dump();
  }

  static constexpr char kDemo[] = "lzk_demo_parity";
  static constexpr char kOps[] = "lzk_ops_parity";
  static constexpr char kCapped[] = "lzk_capped_parity";
  static constexpr char kRated[] = "lzk_rated_parity";

  std::string certs_;
  testing::FakeWorker worker_{"w0"};
  std::shared_ptr<prometheus::Registry> metrics_ = std::make_shared<prometheus::Registry>();
  std::unique_ptr<RouterServer> router_;
  std::unique_ptr<HttpServer> http_;  // shut down before the router
};

TEST_F(FrontParityTest, EveryRefusalBeforeForwardingIsTheSameOnBothFronts) {
  // Both fronts serve the same request when nothing refuses it.
  EXPECT_EQ(Grpc(kDemo, Request()).status, 0);
  WaitForFreeSlot();
  EXPECT_EQ(Http(kDemo, Body()).status, 200);
  WaitForFreeSlot();

  ExpectSame("no API key", Grpc("", Request()), Http("", Body()),
             grpc::StatusCode::UNAUTHENTICATED);
  ExpectSame("an unknown API key", Grpc("lzk_nobody", Request()), Http("lzk_nobody", Body()),
             grpc::StatusCode::UNAUTHENTICATED);
  ExpectSame("a key without the generate scope", Grpc(kOps, Request()), Http(kOps, Body()),
             grpc::StatusCode::PERMISSION_DENIED);

  // Rate: the key's one token goes to the first request; then both fronts are refused.
  ASSERT_EQ(Grpc(kRated, Request()).status, 0);
  WaitForFreeSlot();
  ExpectSame("a key over its request rate", Grpc(kRated, Request()), Http(kRated, Body()),
             grpc::StatusCode::RESOURCE_EXHAUSTED);

  // Validation, in the request validator's words.
  lazyattn::v1::GenerateRequest empty_doc = Request(2);
  empty_doc.mutable_documents(1)->set_text("");
  const Refusal grpc_empty = Grpc(kDemo, empty_doc);
  ExpectSame("an empty document", grpc_empty,
             Http(kDemo, R"({"messages": [{"role": "user", "content": "What is it?"}],
                             "max_tokens": 4, "documents": [{"text": "doc 0"}, {"text": ""}]})"),
             grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(grpc_empty.param, "documents[1].text");
  lazyattn::v1::GenerateRequest long_answer = Request();
  long_answer.mutable_sampling()->set_max_tokens(1 << 30);
  const Refusal grpc_long = Grpc(kDemo, long_answer);
  ExpectSame("max_tokens over the limit", grpc_long,
             Http(kDemo, R"({"messages": [{"role": "user", "content": "What is it?"}],
                             "max_tokens": 1073741824})"),
             grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(grpc_long.param, "sampling.max_tokens");  // HTTP: max_tokens, its own field's name
  ExpectSame("more documents than the router takes", Grpc(kDemo, Request(65)),
             Http(kDemo, Body(65)), grpc::StatusCode::INVALID_ARGUMENT);
  // Within the router's limit (64), over the served model's (the fake worker's 32).
  const Refusal grpc_model_docs = Grpc(kDemo, Request(33));
  ExpectSame("more documents than the model's workers take", grpc_model_docs, Http(kDemo, Body(33)),
             grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(grpc_model_docs.message, HasSubstr("at most 32"));

  // In flight: a stream of `capped` holds its key's one place and the router's one place.
  testing::FakeWorker::Script script;
  script.block = true;
  worker_.SetScript(script);
  grpc::ClientContext stream_ctx;
  stream_ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
  auto capped_stub = Stub(kCapped);
  auto stream = capped_stub->Generate(&stream_ctx, Request());
  ASSERT_TRUE(worker_.WaitForCalls(4, absl::Seconds(10)));  // after the 3 served above
  const Refusal grpc_capped = Grpc(kCapped, Request());
  ExpectSame("a key at its in-flight cap", grpc_capped, Http(kCapped, Body()),
             grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(grpc_capped.message, HasSubstr("API key \"capped\""));
  const Refusal grpc_busy = Grpc(kDemo, Request());
  ExpectSame("the router at its in-flight limit", grpc_busy, Http(kDemo, Body()),
             grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(grpc_busy.message, HasSubstr("limits.max_inflight_requests"));
  // The router at its limit is the service's refusal; a key at its own is the tenant's quota,
  // counted per key and not in requests_total (where the error-ratio alert paged on one
  // client's burst), as a key's rate refusals are not.
  const std::string text = prometheus::TextSerializer().Serialize(metrics_->Collect());
  EXPECT_THAT(text,
              HasSubstr("lazyattn_router_requests_total{model=\"none\",policy=\"cache_aware\","
                        "status=\"resource_exhausted\"} 2"));
  EXPECT_THAT(text, HasSubstr("lazyattn_router_api_key_limited_total{key=\"capped\","
                              "limit=\"in_flight\"} 2"));

  worker_.Unblock();
  lazyattn::v1::GenerateResponse r;
  while (stream->Read(&r)) {
  }
  EXPECT_TRUE(stream->Finish().ok());
}

// Each of a request's `n` choices takes a place under the router's in-flight limit (1 here), all
// before any starts: more choices than the limit can never pass, a 400 naming `n`, and nothing
// reaches the worker. (Fewer places free than choices, a 429 naming it: http_server_test.)
TEST_F(FrontParityTest, MoreChoicesThanTheRoutersLimitAre400BeforeAnyStarts) {
  const std::string two = R"({"messages": [{"role": "user", "content": "What is it?"}],
                             "max_tokens": 4, "n": 2})";
  const int calls_before = worker_.generate_calls();
  const Refusal refused = Http(kDemo, two);
  EXPECT_EQ(refused.status, 400);
  EXPECT_THAT(refused.message, HasSubstr("n: 2 choices need as many places in flight"));
  EXPECT_THAT(refused.message, HasSubstr("limits.max_inflight_requests"));
  EXPECT_EQ(refused.param, "n");
  WaitForFreeSlot();
  EXPECT_EQ(Http(kDemo, Body()).status, 200);
  EXPECT_EQ(worker_.generate_calls(), calls_before + 1);  // the last request's only
}

}  // namespace
}  // namespace lazyattn::router
