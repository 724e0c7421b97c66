// Shared by the router server tests (router_server_*_test.cc): the router over real gRPC on
// 127.0.0.1 (ports chosen by the OS), in front of scripted fake workers and a fake KV directory
// (fake_cluster_for_test.h), with a client stub and the router's metrics. Timing never decides an
// outcome: directory lookups get generous deadlines except in the test about a hanging directory,
// worker lists are refreshed explicitly, and blocking fakes are released by the test.
#ifndef LAZYATTN_SERVICES_ROUTER_SERVER_ROUTER_SERVER_TEST_FIXTURE_H_
#define LAZYATTN_SERVICES_ROUTER_SERVER_ROUTER_SERVER_TEST_FIXTURE_H_

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "lazyattn/v1/inference.grpc.pb.h"
#include "services/router/server/fake_cluster_for_test.h"
#include "services/router/server/router_options.h"
#include "services/router/server/router_server.h"

namespace lazyattn::router::testing {

struct StreamResult {
  std::vector<std::string> tokens;
  std::vector<lazyattn::v1::TokenChunk> chunks;  // the token messages as they came
  std::optional<lazyattn::v1::Final> final;
  grpc::Status status;
  int other_events = 0;  // neither a token nor the final: never meant for a client
};

// Outside an anonymous namespace: the tests of one fixture in several files must share its type.
class RouterServerTest : public ::testing::Test {
 protected:
  void StartWorkers(int n) {
    for (int i = 0; i < n; ++i) {
      workers_.push_back(std::make_unique<FakeWorker>(absl::StrCat("w", i)));
      workers_.back()->Start();
    }
  }

  void StartKvdir() {
    kvdir_.Start();
    std::vector<lazyattn::v1::WorkerStatus> statuses;
    for (const auto& w : workers_) statuses.push_back(w->Status());
    kvdir_.SetWorkers(statuses);
  }

  RouterOptions Options() {
    RouterOptions o = RouterOptionsForFakeKvdir(kvdir_.address());
    return o;
  }

  void StartRouter(const RouterOptions& options) {
    registry_ = std::make_shared<prometheus::Registry>();
    auto server = RouterServer::Create(options, registry_);
    ASSERT_TRUE(server.ok()) << server.status();
    router_ = std::move(*server);
    stub_ = lazyattn::v1::Inference::NewStub(grpc::CreateChannel(
        absl::StrCat("127.0.0.1:", router_->port()), grpc::InsecureChannelCredentials()));
  }

  static lazyattn::v1::GenerateRequest Request(const std::vector<std::string>& docs,
                                               const std::string& question = "What is it?") {
    lazyattn::v1::GenerateRequest r;
    for (const auto& d : docs) r.add_documents()->set_text(d);
    r.set_question(question);
    return r;
  }

  StreamResult Stream(const lazyattn::v1::GenerateRequest& request,
                      absl::Duration deadline = absl::Seconds(30)) {
    StreamResult result;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
    auto reader = stub_->Generate(&ctx, request);
    lazyattn::v1::GenerateResponse r;
    while (reader->Read(&r)) {
      if (r.has_token()) {
        result.tokens.push_back(r.token().text());
        result.chunks.push_back(r.token());
      }
      if (r.has_final()) result.final = r.final();
      if (!r.has_token() && !r.has_final()) ++result.other_events;
    }
    result.status = reader->Finish();
    return result;
  }

  std::string Metrics() const {
    return prometheus::TextSerializer().Serialize(registry_->Collect());
  }
  // The metrics once they contain `want` (a call is counted when it has ended on the router's side
  // too, which may come after the client's end), or as they are after `timeout`.
  std::string MetricsOnceContaining(const std::string& want,
                                    absl::Duration timeout = absl::Seconds(30)) const {
    const absl::Time until = absl::Now() + timeout;
    std::string metrics = Metrics();
    while (metrics.find(want) == std::string::npos && absl::Now() < until) {
      absl::SleepFor(absl::Milliseconds(10));
      metrics = Metrics();
    }
    return metrics;
  }

  std::vector<std::unique_ptr<FakeWorker>> workers_;
  FakeKvdir kvdir_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<RouterServer> router_;  // destroyed before the fakes
  std::unique_ptr<lazyattn::v1::Inference::Stub> stub_;
};

}  // namespace lazyattn::router::testing

#endif  // LAZYATTN_SERVICES_ROUTER_SERVER_ROUTER_SERVER_TEST_FIXTURE_H_
