// Two models behind one router, over real gRPC with scripted fake workers and a fake directory:
// requests reach only their own model's workers (first choice, failover, Prefetch), the choice of
// model is checked, GetModelInfo lists the models, and a model whose workers left is refused.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <prometheus/registry.h>

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "lazyattn/v1/inference.grpc.pb.h"
#include "services/router/server/fake_cluster_for_test.h"
#include "services/router/server/router_server.h"

namespace lazyattn::router {
namespace {

using lazyattn::v1::GenerateRequest;
using lazyattn::v1::GenerateResponse;
using ::testing::AnyOf;
using ::testing::ElementsAre;
using testing::FakeKvdir;
using testing::RouterOptionsForFakeKvdir;
using testing::FakeWorker;
using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

constexpr char kNameA[] = "fake-model";  // FakeWorker's own
constexpr char kNameB[] = "fake-model-b";
constexpr char kFpB[] = "fake-model-b-fp";

class ModelRoutingTest : public ::testing::Test {
 protected:
  // w0, w1 serve model A (the fakes' own); w2, w3 model B.
  void SetUp() override {
    for (int i = 0; i < 4; ++i) {
      workers_.push_back(std::make_unique<FakeWorker>(absl::StrCat("w", i)));
      workers_.back()->Start();
    }
    kvdir_.Start();
    List({0, 1, 2, 3});
    kvdir_.Hold("w0", "doc", 500);  // under model A's key: w0 is A's first choice for "doc"
  }

  void List(const std::vector<int>& which) {
    std::vector<lazyattn::v1::WorkerStatus> statuses;
    for (int i : which) {
      lazyattn::v1::WorkerStatus s = workers_[i]->Status();
      if (i >= 2) {
        s.mutable_model()->set_name(kNameB);
        s.mutable_model()->set_model_fingerprint(kFpB);
        s.mutable_model()->set_max_documents(8);
      }
      statuses.push_back(s);
    }
    kvdir_.SetWorkers(statuses);
  }

  void StartRouter(absl::Duration forget_after = absl::Seconds(10)) {
    RouterOptions o = RouterOptionsForFakeKvdir(kvdir_.address());
    o.kvdir.forget_after = forget_after;
    o.routing.max_attempts = 4;  // enough to reach the other model, were it allowed
    registry_ = std::make_shared<prometheus::Registry>();
    auto server = RouterServer::Create(o, registry_);
    ASSERT_TRUE(server.ok()) << server.status();
    router_ = std::move(*server);
    stub_ = lazyattn::v1::Inference::NewStub(grpc::CreateChannel(
        absl::StrCat("127.0.0.1:", router_->port()), grpc::InsecureChannelCredentials()));
  }

  static GenerateRequest Request(const std::string& model, const std::string& doc = "doc") {
    GenerateRequest r;
    r.add_documents()->set_text(doc);
    r.set_question("What is it?");
    r.set_model(model);
    return r;
  }

  // The worker that served the request, or the status's code and message.
  std::string Serve(const GenerateRequest& request) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    auto reader = stub_->Generate(&ctx, request);
    GenerateResponse r;
    std::string worker;
    while (reader->Read(&r)) {
      if (r.has_final()) worker = r.final().worker();
    }
    grpc::Status s = reader->Finish();
    if (!s.ok()) return absl::StrCat("error ", s.error_code(), ": ", s.error_message());
    return worker;
  }

  int GenerateCalls(std::vector<int> which) const {
    int n = 0;
    for (int i : which) n += workers_[i]->generate_calls();
    return n;
  }

  std::vector<std::unique_ptr<FakeWorker>> workers_;
  FakeKvdir kvdir_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<RouterServer> router_;  // destroyed before the fakes
  std::unique_ptr<lazyattn::v1::Inference::Stub> stub_;
};

TEST_F(ModelRoutingTest, RequestsReachOnlyTheirOwnModelsWorkers) {
  StartRouter();
  std::set<std::string> served_a, served_b;
  for (int i = 0; i < 6; ++i) {
    const std::string doc = absl::StrCat("doc ", i);
    served_a.insert(Serve(Request(kNameA, doc)));
    served_b.insert(Serve(Request(kNameB, doc)));
  }
  // The document held under A's key sends A's requests to w0; B computes its own key for it.
  served_a.insert(Serve(Request(kNameA, "doc")));
  served_b.insert(Serve(Request(kNameB, "doc")));
  for (const std::string& w : served_a) EXPECT_THAT(w, AnyOf("w0", "w1"));
  for (const std::string& w : served_b) EXPECT_THAT(w, AnyOf("w2", "w3"));
  EXPECT_EQ(GenerateCalls({0, 1}), 7);
  EXPECT_EQ(GenerateCalls({2, 3}), 7);
  EXPECT_EQ(workers_[0]->last_request().model(), kNameA);
  // The model pinned by its fingerprint prefix reaches the same workers.
  EXPECT_THAT(Serve(Request("fake-model-b@fake-model-b")), AnyOf("w2", "w3"));
}

TEST_F(ModelRoutingTest, FailoverAndRetriesStayWithinTheModel) {
  workers_[0]->SetScript({.fail_before_first_token = grpc::StatusCode::UNAVAILABLE});
  StartRouter();
  EXPECT_EQ(Serve(Request(kNameA)), "w1");  // w0 first (it holds "doc"), then w1
  workers_[1]->SetScript({.fail_before_first_token = grpc::StatusCode::UNAVAILABLE});
  const std::string all_failed = Serve(Request(kNameA));
  EXPECT_THAT(all_failed, HasSubstr("error 14"));  // UNAVAILABLE
  EXPECT_THAT(all_failed, HasSubstr("2 attempts"));
  EXPECT_EQ(GenerateCalls({2, 3}), 0);  // four attempts allowed, two A workers: B never tried
}

TEST_F(ModelRoutingTest, AMissingOrUnknownModelIsRefusedNamingTheField) {
  StartRouter();
  const std::string missing = Serve(Request(""));
  EXPECT_THAT(missing, HasSubstr("error 3"));  // INVALID_ARGUMENT
  EXPECT_THAT(missing, HasSubstr("model: required"));
  EXPECT_THAT(missing, HasSubstr("fake-model, fake-model-b"));
  const std::string unknown = Serve(Request("gpt-4o"));
  EXPECT_THAT(unknown, HasSubstr("error 5"));  // NOT_FOUND
  EXPECT_THAT(unknown, HasSubstr("model: \"gpt-4o\" is not served"));
  // Complete takes the same path.
  grpc::ClientContext ctx;
  lazyattn::v1::CompleteResponse response;
  grpc::Status s = stub_->Complete(&ctx, Request(""), &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(GenerateCalls({0, 1, 2, 3}), 0);
}

TEST_F(ModelRoutingTest, GetModelInfoListsEveryModelAndKeepsTheSingleModelFieldsForOne) {
  StartRouter(absl::Milliseconds(1));
  {
    grpc::ClientContext ctx;
    lazyattn::v1::ModelInfo info;
    ASSERT_TRUE(stub_->GetModelInfo(&ctx, {}, &info).ok());
    EXPECT_EQ(info.name(), "");  // several: no single model to describe
    EXPECT_EQ(info.workers(), 4);
    ASSERT_EQ(info.models_size(), 2);
    EXPECT_EQ(info.models(0).id(), kNameA);
    EXPECT_EQ(info.models(0).workers(), 2);
    EXPECT_EQ(info.models(0).max_documents(), 32);
    EXPECT_EQ(info.models(1).id(), kNameB);
    EXPECT_EQ(info.models(1).model_fingerprint(), kFpB);
    EXPECT_EQ(info.models(1).max_documents(), 8);
  }
  // A's workers leave the directory; the next lookup's answer drops them.
  List({2, 3});
  EXPECT_THAT(Serve(Request(kNameB)), AnyOf("w2", "w3"));
  {
    grpc::ClientContext ctx;
    lazyattn::v1::ModelInfo info;
    ASSERT_TRUE(stub_->GetModelInfo(&ctx, {}, &info).ok());
    EXPECT_EQ(info.name(), kNameB);
    EXPECT_EQ(info.id(), kNameB);
    EXPECT_EQ(info.model_fingerprint(), kFpB);
    EXPECT_EQ(info.workers(), 2);
    EXPECT_EQ(info.max_documents(), 8);
    ASSERT_EQ(info.models_size(), 1);
    EXPECT_EQ(info.models(0).id(), kNameB);
  }
}

TEST_F(ModelRoutingTest, AModelWhoseWorkersLeftIsNotFoundAndTheRestIsTheDefault) {
  StartRouter(absl::Milliseconds(1));
  EXPECT_THAT(Serve(Request(kNameA)), AnyOf("w0", "w1"));
  List({2, 3});
  // Past forget_after (1 ms) of the last listing of A's workers, so that the next answer forgets
  // them. This request chose A before its lookup told the router A's workers are gone.
  absl::SleepFor(absl::Milliseconds(5));
  const std::string first = Serve(Request(kNameA));
  EXPECT_THAT(first, HasSubstr("error 14: no live workers of the request's model"));
  const std::string gone = Serve(Request(kNameA));
  EXPECT_THAT(gone, HasSubstr("error 5"));
  EXPECT_THAT(gone, HasSubstr("\"fake-model\" is not served by any live worker; served: "
                              "fake-model-b"));
  // One model left: a request without `model` is served by it.
  EXPECT_THAT(Serve(Request("")), AnyOf("w2", "w3"));
  EXPECT_EQ(GenerateCalls({0, 1}), 1);
}

// Prefetch is refused alike: its first try after the workers left may have chosen the model
// before its lookup said they were gone, and must then say so, not that no worker exists at all.
TEST_F(ModelRoutingTest, PrefetchForAModelWhoseWorkersLeftSaysSo) {
  StartRouter(absl::Milliseconds(1));
  EXPECT_THAT(Serve(Request(kNameA)), AnyOf("w0", "w1"));
  List({2, 3});
  absl::SleepFor(absl::Milliseconds(5));  // past forget_after of A's last listing
  lazyattn::v1::PrefetchRequest request;
  request.add_documents()->set_text("doc");
  request.set_model(kNameA);
  for (int i = 0; i < 2; ++i) {
    grpc::ClientContext ctx;
    lazyattn::v1::PrefetchResponse response;
    const grpc::Status s = stub_->Prefetch(&ctx, request, &response);
    if (i == 0) {
      // It chose A from the registry, and its own lookup then removed A's workers.
      EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
      EXPECT_THAT(s.error_message(), HasSubstr("no live workers of the request's model"));
    } else {
      EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
      EXPECT_THAT(s.error_message(), HasSubstr("is not served by any live worker"));
    }
  }
  EXPECT_EQ(workers_[0]->prefetch_calls() + workers_[1]->prefetch_calls(), 0);
}

TEST_F(ModelRoutingTest, PrefetchWarmsOnlyTheNamedModelsWorkers) {
  StartRouter();
  lazyattn::v1::PrefetchRequest request;
  request.add_documents()->set_text("doc");
  request.set_replicas(4);
  request.set_model(kNameB);
  grpc::ClientContext ctx;
  lazyattn::v1::PrefetchResponse response;
  ASSERT_TRUE(stub_->Prefetch(&ctx, request, &response).ok());
  EXPECT_THAT(response.workers(), UnorderedElementsAre("w2", "w3"));
  EXPECT_EQ(workers_[0]->prefetch_calls() + workers_[1]->prefetch_calls(), 0);

  request.set_model("");
  grpc::ClientContext ctx2;
  grpc::Status s = stub_->Prefetch(&ctx2, request, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("model: required"));
}

}  // namespace
}  // namespace lazyattn::router
