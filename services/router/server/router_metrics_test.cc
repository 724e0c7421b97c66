// The router's per-model metrics: RouterMetrics' `model` label on its own (the reserved values,
// the bound on label values), and over real gRPC with two models of scripted fake workers: each
// request counts under the model it was routed to, and a request naming a model nobody serves
// counts under "none" and adds no series.
#include "services/router/server/router_metrics.h"

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "lazyattn/v1/inference.grpc.pb.h"
#include "services/router/server/fake_cluster_for_test.h"
#include "services/router/server/router_server.h"

namespace lazyattn::router {
namespace {

using lazyattn::v1::GenerateRequest;
using lazyattn::v1::GenerateResponse;
using testing::FakeKvdir;
using testing::RouterOptionsForFakeKvdir;
using testing::FakeWorker;
using ::testing::HasSubstr;
using ::testing::Not;

std::string Serialize(const prometheus::Registry& registry) {
  return prometheus::TextSerializer().Serialize(registry.Collect());
}

// The series of an exposition: each sample line without its value.
std::set<std::string> Series(const std::string& text) {
  std::set<std::string> out;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (line.empty() || line[0] == '#') continue;
    out.insert(std::string(line.substr(0, line.rfind(' '))));
  }
  return out;
}

TEST(RouterMetricsTest, ModelLabelIsNoneUntilChosenAndBoundedAfter) {
  prometheus::Registry registry;
  RouterMetrics metrics(registry, "cache_aware");
  // From the start, so dashboards read zeros.
  EXPECT_THAT(Serialize(registry),
              HasSubstr("lazyattn_router_requests_total{model=\"none\",policy=\"cache_aware\","
                        "status=\"ok\"} 0"));
  EXPECT_EQ(&metrics.ForModel(""), &metrics.NoModel());
  metrics.CountRequest(grpc::StatusCode::INVALID_ARGUMENT);  // admission: no model yet
  EXPECT_THAT(Serialize(registry),
              HasSubstr("lazyattn_router_requests_total{model=\"none\",policy=\"cache_aware\","
                        "status=\"invalid_argument\"} 1"));

  ModelMetrics& a = metrics.ForModel("model-a");
  EXPECT_EQ(&metrics.ForModel("model-a"), &a);
  EXPECT_EQ(a.label(), "model-a");
  a.CountRetry();
  metrics.CountSelection("w0", a);
  metrics.CountSelection("w0", metrics.NoModel());
  std::string text = Serialize(registry);
  EXPECT_THAT(text, HasSubstr("lazyattn_router_retries_total{model=\"model-a\"} 1"));
  EXPECT_THAT(text, HasSubstr("lazyattn_router_retries_total{model=\"none\"} 0"));
  EXPECT_THAT(text, HasSubstr("lazyattn_router_worker_selections_total{model=\"model-a\","
                              "worker=\"w0\"} 1"));
  EXPECT_THAT(text, HasSubstr("lazyattn_router_worker_selections_total{model=\"none\","
                              "worker=\"w0\"} 1"));

  // Ids past the bound share "other": however many a long life of upgrades brings.
  for (size_t i = 1; i < kMaxModelLabels; ++i) metrics.ForModel(absl::StrCat("m", i));
  EXPECT_EQ(metrics.ForModel(absl::StrCat("m", kMaxModelLabels - 1)).label(),
            absl::StrCat("m", kMaxModelLabels - 1));
  const std::set<std::string> before = Series(Serialize(registry));
  ModelMetrics& other = metrics.ForModel("one-too-many");
  EXPECT_EQ(other.label(), kOtherModelLabel);
  EXPECT_EQ(&metrics.ForModel("and-another"), &other);
  EXPECT_EQ(&metrics.ForModel("model-a"), &a);  // the ones seen keep theirs
  text = Serialize(registry);
  EXPECT_THAT(text, Not(HasSubstr("one-too-many")));
  EXPECT_THAT(text, HasSubstr("lazyattn_router_ttft_seconds_count{model=\"other\"} 0"));
  EXPECT_GT(Series(text).size(), before.size());
  metrics.ForModel("a-third");
  EXPECT_EQ(Series(Serialize(registry)), Series(text));
}

constexpr char kNameA[] = "fake-model";  // FakeWorker's own
constexpr char kNameB[] = "fake-model-b";

class ModelMetricsTest : public ::testing::Test {
 protected:
  // w0, w1 serve model A (the fakes' own); w2, w3 model B.
  void SetUp() override {
    for (int i = 0; i < 4; ++i) {
      workers_.push_back(std::make_unique<FakeWorker>(absl::StrCat("w", i)));
      workers_.back()->Start();
    }
    kvdir_.Start();
    std::vector<lazyattn::v1::WorkerStatus> statuses;
    for (int i = 0; i < 4; ++i) {
      lazyattn::v1::WorkerStatus s = workers_[i]->Status();
      if (i >= 2) {
        s.mutable_model()->set_name(kNameB);
        s.mutable_model()->set_model_fingerprint("fake-model-b-fp");
      }
      statuses.push_back(s);
    }
    kvdir_.SetWorkers(statuses);
    kvdir_.Hold("w0", "doc", 500);  // under model A's key: w0 is A's first choice for "doc"

    RouterOptions o = RouterOptionsForFakeKvdir(kvdir_.address());
    o.routing.max_attempts = 4;
    registry_ = std::make_shared<prometheus::Registry>();
    auto server = RouterServer::Create(o, registry_);
    ASSERT_TRUE(server.ok()) << server.status();
    router_ = std::move(*server);
    stub_ = lazyattn::v1::Inference::NewStub(grpc::CreateChannel(
        absl::StrCat("127.0.0.1:", router_->port()), grpc::InsecureChannelCredentials()));
  }

  grpc::Status Serve(const std::string& model) {
    GenerateRequest r;
    r.add_documents()->set_text("doc");
    r.set_question("What is it?");
    r.set_model(model);
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    auto reader = stub_->Generate(&ctx, r);
    GenerateResponse response;
    while (reader->Read(&response)) {
    }
    return reader->Finish();
  }

  std::string Metrics() const { return Serialize(*registry_); }

  std::vector<std::unique_ptr<FakeWorker>> workers_;
  FakeKvdir kvdir_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<RouterServer> router_;  // destroyed before the fakes
  std::unique_ptr<lazyattn::v1::Inference::Stub> stub_;
};

TEST_F(ModelMetricsTest, EachRequestCountsUnderTheModelItWasRoutedTo) {
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(Serve(kNameA).ok());
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(Serve(kNameB).ok());
  // Both of B's workers refuse: one request of B fails after one retry.
  for (int i : {2, 3}) {
    workers_[i]->SetScript({.fail_before_first_token = grpc::StatusCode::UNAVAILABLE});
  }
  EXPECT_EQ(Serve(kNameB).error_code(), grpc::StatusCode::UNAVAILABLE);

  const std::string m = Metrics();
  const auto requests = [](const std::string& model, const std::string& status, int n) {
    return HasSubstr(absl::StrCat("lazyattn_router_requests_total{model=\"", model,
                                  "\",policy=\"cache_aware\",status=\"", status, "\"} ", n));
  };
  EXPECT_THAT(m, requests(kNameA, "ok", 3));
  EXPECT_THAT(m, requests(kNameB, "ok", 2));
  EXPECT_THAT(m, requests(kNameA, "unavailable", 0));
  EXPECT_THAT(m, requests(kNameB, "unavailable", 1));
  EXPECT_THAT(m, requests("none", "ok", 0));
  EXPECT_THAT(m, HasSubstr("lazyattn_router_ttft_seconds_count{model=\"fake-model\"} 3"));
  EXPECT_THAT(m, HasSubstr("lazyattn_router_ttft_seconds_count{model=\"fake-model-b\"} 2"));
  // B's failed request ended without a token: the TTFT objective sees how long it waited.
  EXPECT_THAT(m,
              HasSubstr("lazyattn_router_no_first_token_seconds_count{model=\"fake-model-b\"} 1"));
  EXPECT_THAT(m, HasSubstr("lazyattn_router_no_first_token_seconds_count{model=\"fake-model\"} 0"));
  EXPECT_THAT(m,
              HasSubstr("lazyattn_router_request_duration_seconds_count{model=\"fake-model\"} 3"));
  EXPECT_THAT(m, HasSubstr("lazyattn_router_retries_total{model=\"fake-model\"} 0"));
  EXPECT_THAT(m, HasSubstr("lazyattn_router_retries_total{model=\"fake-model-b\"} 1"));
  // The directory shows "doc" on w0 under A's key only, with 500 tokens: capped at the 3 + 16
  // a 3-byte text can have (DocumentRef::max_tokens), 19 a request.
  EXPECT_THAT(m, HasSubstr("lazyattn_router_predicted_hit_tokens_total{model=\"fake-model\"} 57"));
  EXPECT_THAT(m,
              HasSubstr("lazyattn_router_prediction_error_tokens_count{model=\"fake-model\"} 3"));
  EXPECT_THAT(m, HasSubstr("lazyattn_router_worker_selections_total{model=\"fake-model\","
                           "worker=\"w0\"} 3"));
  for (const std::string& series : Series(m)) {
    if (series.find("worker=\"w2\"") != std::string::npos ||
        series.find("worker=\"w3\"") != std::string::npos) {
      EXPECT_THAT(series, HasSubstr("model=\"fake-model-b\"")) << series;
    }
  }
}

TEST_F(ModelMetricsTest, AnUnknownOrMissingModelCountsUnderNoneAndAddsNoSeries) {
  ASSERT_TRUE(Serve(kNameA).ok());
  ASSERT_TRUE(Serve(kNameB).ok());
  const std::set<std::string> before = Series(Metrics());
  const std::string hostile = absl::StrCat("attacker-", std::string(200, 'x'));
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(Serve(absl::StrCat(hostile, i)).error_code(), grpc::StatusCode::NOT_FOUND);
  }
  // Two names served: an empty `model` chooses none.
  EXPECT_EQ(Serve("").error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  const std::string m = Metrics();
  EXPECT_EQ(Series(m), before);
  EXPECT_THAT(m, Not(HasSubstr("attacker-")));
  EXPECT_THAT(m, HasSubstr("lazyattn_router_requests_total{model=\"none\",policy=\"cache_aware\","
                           "status=\"not_found\"} 3"));
  EXPECT_THAT(m, HasSubstr("lazyattn_router_requests_total{model=\"none\",policy=\"cache_aware\","
                           "status=\"invalid_argument\"} 1"));
  EXPECT_THAT(m, HasSubstr("lazyattn_router_requests_total{model=\"fake-model\","
                           "policy=\"cache_aware\",status=\"not_found\"} 0"));
}

}  // namespace
}  // namespace lazyattn::router
