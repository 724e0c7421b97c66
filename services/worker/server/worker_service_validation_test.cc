// Bad requests are INVALID_ARGUMENT naming the field, before any work: malformed fields, the
// router's limits (the worker is reachable directly), and invalid UTF-8 (counted per field), on
// Generate and Prefetch alike; the worker serves on afterwards. A model other than the worker's
// is NOT_FOUND, as at the router.
#include <grpcpp/grpcpp.h>

#include <cctype>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/worker_call_trailer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lazyattn/v1/worker.grpc.pb.h"
#include "services/worker/server/worker_service.h"
#include "services/worker/server/worker_service_test_fixture.h"

namespace lazyattn {
namespace {

using ::testing::HasSubstr;
using testing::kDocs;
using testing::MetricValue;
using testing::StreamResult;
using testing::TextDoc;
using testing::WorkerServiceTest;

TEST_F(WorkerServiceTest, BadRequestsAreInvalidArgumentNamingTheField) {
  StartServer(/*slow=*/false, /*max_documents=*/4);
  struct Case {
    std::string name;
    std::function<void(v1::GenerateRequest&)> mutate;
    std::string field;
  };
  const std::vector<Case> cases = {
      {"too many documents",
       [](v1::GenerateRequest& r) {
         for (int i = 0; i < 3; ++i) *r.add_documents() = TextDoc("more");
       },
       "documents"},
      {"empty document", [](v1::GenerateRequest& r) { r.mutable_documents(1)->set_text(""); },
       "documents[1]"},
      {"document without content",
       [](v1::GenerateRequest& r) { r.mutable_documents(0)->clear_content(); }, "documents[0]"},
      {"token id out of range",
       [](v1::GenerateRequest& r) {
         auto* ids = r.mutable_documents(2)->mutable_tokens()->mutable_ids();
         ids->Add(5);
         ids->Add(300);
       },
       "documents[2].tokens.ids[1]"},
      {"negative temperature",
       [](v1::GenerateRequest& r) { r.mutable_sampling()->set_temperature(-1); },
       "sampling.temperature"},
      {"negative top_k", [](v1::GenerateRequest& r) { r.mutable_sampling()->set_top_k(-2); },
       "sampling.top_k"},
      {"top_p above 1", [](v1::GenerateRequest& r) { r.mutable_sampling()->set_top_p(1.5f); },
       "sampling.top_p"},
      {"negative max_tokens",
       [](v1::GenerateRequest& r) { r.mutable_sampling()->set_max_tokens(-1); },
       "sampling.max_tokens"},
      {"top_logprobs above 20",
       [](v1::GenerateRequest& r) {
         r.mutable_sampling()->set_logprobs(true);
         r.mutable_sampling()->set_top_logprobs(21);
       },
       "sampling.top_logprobs"},
      {"top_logprobs without logprobs",
       [](v1::GenerateRequest& r) { r.mutable_sampling()->set_top_logprobs(2); },
       "sampling.top_logprobs"},
      {"logit_bias id outside the vocabulary",
       [](v1::GenerateRequest& r) { (*r.mutable_sampling()->mutable_logit_bias())[300] = 1.0f; },
       "sampling.logit_bias[300]: token id 300 outside the vocabulary"},
      {"logit_bias above 100",
       [](v1::GenerateRequest& r) { (*r.mutable_sampling()->mutable_logit_bias())[5] = 150.0f; },
       "sampling.logit_bias[5]: bias 150 outside [-100, 100]"},
      {"unknown cache mode",
       [](v1::GenerateRequest& r) { r.set_cache_mode(static_cast<v1::CacheMode>(42)); },
       "cache_mode"},
      {"empty question", [](v1::GenerateRequest& r) { r.clear_question(); }, "question"},
      {"chat without a template", [](v1::GenerateRequest& r) { r.set_chat(true); }, "chat"},
  };
  for (const Case& c : cases) {
    v1::GenerateRequest r = Request(kDocs, 4);
    c.mutate(r);
    const StreamResult out = Generate(r);
    EXPECT_EQ(out.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.name;
    EXPECT_THAT(out.status.error_message(), HasSubstr(c.field)) << c.name;
    EXPECT_TRUE(out.chunks.empty()) << c.name;
  }
  EXPECT_EQ(Requests("invalid_argument"), static_cast<double>(cases.size()));
  // The worker still serves.
  EXPECT_TRUE(Generate(Request(kDocs, 2)).status.ok());
  ExpectIdle();
}

// The router's limits hold at the worker too (it is reachable directly).
TEST_F(WorkerServiceTest, TheRoutersLimitsAreEnforced) {
  StartServer();
  struct Case {
    std::function<void(v1::GenerateRequest&)> mutate;
    std::string message;
  };
  const std::vector<Case> cases = {
      {[](v1::GenerateRequest& r) { r.mutable_sampling()->set_max_tokens(4097); },
       "sampling.max_tokens: 4097 outside [0, 4096]"},
      {[](v1::GenerateRequest& r) {
         for (int i = 0; i < 17; ++i) r.mutable_sampling()->add_stop("x");
       },
       "sampling.stop: 17 stop strings, the limit is 16"},
      {[](v1::GenerateRequest& r) { r.mutable_sampling()->add_stop(std::string(257, 's')); },
       "sampling.stop[0]: 257 bytes, the limit is 256"},
      {[](v1::GenerateRequest& r) {
         for (int i = 0; i < 65; ++i) r.mutable_sampling()->add_stop_token_ids(1);
       },
       "sampling.stop_token_ids: 65 ids, the limit is 64"},
      {[](v1::GenerateRequest& r) {
         for (int i = 0; i < 301; ++i) (*r.mutable_sampling()->mutable_logit_bias())[i] = 1.0f;
       },
       "sampling.logit_bias: 301 entries, the limit is 300"},
      {[](v1::GenerateRequest& r) { r.mutable_documents(0)->set_id(std::string(257, 'i')); },
       "documents[0].id: 257 bytes, the limit is 256"},
      {[](v1::GenerateRequest& r) { r.set_question(std::string((64 << 10) + 1, 'q')); },
       "question: 65537 bytes"},
      {[](v1::GenerateRequest& r) { r.set_system(std::string((64 << 10) + 1, 's')); },
       "system: 65537 bytes"},
      {[](v1::GenerateRequest& r) {
         r.mutable_documents(1)->set_text(std::string((1 << 20) + 1, 'd'));
       },
       "documents[1].text: 1048577 bytes, the limit is 1048576"},
  };
  for (const Case& c : cases) {
    v1::GenerateRequest r = Request(kDocs, 4);
    c.mutate(r);
    const StreamResult out = Generate(r);
    EXPECT_EQ(out.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.message;
    EXPECT_THAT(out.status.error_message(), HasSubstr(c.message));
  }
  EXPECT_EQ(Requests("invalid_argument"), static_cast<double>(cases.size()));
  ExpectIdle();
}

// Text fields are `bytes` on the wire: invalid UTF-8 reaches the service, which names the field
// and counts it (a `string` field made gRPC's parser refuse the call as UNIMPLEMENTED, silently).
TEST_F(WorkerServiceTest, InvalidUtf8IsInvalidArgumentNamingTheFieldAndCounted) {
  StartServer();
  const std::string bad = "ab\xF0\x9F";  // a four-byte sequence cut short
  struct Case {
    std::function<void(v1::GenerateRequest&)> mutate;
    std::string field;
    std::string label;
  };
  const std::vector<Case> cases = {
      {[&](v1::GenerateRequest& r) { r.set_system(bad); }, "system", "system"},
      {[&](v1::GenerateRequest& r) { r.set_question(bad); }, "question", "question"},
      {[&](v1::GenerateRequest& r) { r.mutable_documents(2)->set_id(bad); }, "documents[2].id",
       "documents.id"},
      {[&](v1::GenerateRequest& r) { r.mutable_documents(1)->set_text(bad); },
       "documents[1].text", "documents.text"},
      {[&](v1::GenerateRequest& r) {
         r.mutable_sampling()->add_stop("ok");
         r.mutable_sampling()->add_stop(bad);
       },
       "sampling.stop[1]", "sampling.stop"},
  };
  for (const Case& c : cases) {
    v1::GenerateRequest r = Request(kDocs, 4);
    c.mutate(r);
    const StreamResult out = Generate(r);
    EXPECT_EQ(out.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.field;
    EXPECT_THAT(out.status.error_message(),
                HasSubstr(c.field + ": not valid UTF-8 (byte 2 of 4, value 0xf0)"));
    EXPECT_TRUE(out.chunks.empty());
  }
  for (const std::string field : {"id", "text"}) {
    v1::PrefetchRequest p;
    *p.add_documents() = TextDoc(kDocs[0]);
    *p.add_documents() = TextDoc(kDocs[1]);
    if (field == "id") {
      p.mutable_documents(1)->set_id(bad);
    } else {
      p.mutable_documents(1)->set_text(bad);
    }
    grpc::ClientContext ctx;
    v1::PrefetchResponse resp;
    const grpc::Status s = stub_->Prefetch(&ctx, p, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << field;
    EXPECT_THAT(s.error_message(), HasSubstr("documents[1]." + field + ": not valid UTF-8"));
  }
  EXPECT_EQ(Requests("invalid_argument"), static_cast<double>(cases.size()));
  for (const Case& c : cases) {
    const double prefetches = c.label == "documents.id" || c.label == "documents.text" ? 1 : 0;
    EXPECT_EQ(MetricValue(*server_->registry(), "lazyattn_worker_invalid_utf8_requests_total",
                          {{"field", c.label}}),
              1 + prefetches)
        << c.label;
  }
  // Valid UTF-8 beyond ASCII is served.
  v1::GenerateRequest fine = Request({"caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80"}, 2);
  EXPECT_TRUE(Generate(fine).status.ok());
  ExpectIdle();
}

// GenerateRequest.model as vLLM's `model`: a worker called directly runs a request only for its
// own model, named as the router names it (ModelInfo.id forms, model_groups.h) or not at all;
// another is NOT_FOUND and a malformed one INVALID_ARGUMENT, with the router's messages. A call
// the router routed (its expected-model metadata names this worker's model) is taken whatever
// name the router resolved: a model's workers need not all report the same name.
TEST_F(WorkerServiceTest, TheRequestedModelMustBeThisWorkersModel) {
  StartServer();
  const v1::ModelInfo served = Status().model();
  ASSERT_EQ(served.name(), "tiny-test");
  ASSERT_GE(served.model_fingerprint().size(), 12u);
  ASSERT_FALSE(served.tokenizer_fingerprint().empty());
  const std::string& fp = served.model_fingerprint();
  const std::string& tok = served.tokenizer_fingerprint();
  std::string upper = fp.substr(0, 8);
  for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  const std::string wrong_prefix(1, fp[0] == '0' ? '1' : '0');
  for (const std::string& model :
       {std::string(), served.name(), absl::StrCat("tiny-test@", fp.substr(0, 12)),
        absl::StrCat("tiny-test@", upper, ".", tok.substr(0, 4)),
        absl::StrCat("tiny-test@", fp, ".", tok)}) {
    v1::GenerateRequest r = Request(kDocs, 2);
    r.set_model(model);
    const StreamResult out = Generate(r);
    EXPECT_TRUE(out.status.ok()) << "\"" << model << "\": " << out.status.error_message();
    EXPECT_EQ(out.chunks.size(), 2u) << model;
  }
  struct Case {
    std::string model;
    grpc::StatusCode code;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"other-model", grpc::StatusCode::NOT_FOUND,
       "model: \"other-model\" is not served by this worker; it serves tiny-test"},
      {"tiny-test@" + wrong_prefix, grpc::StatusCode::NOT_FOUND,
       "model: \"tiny-test@" + wrong_prefix + "\" is not served"},
      {"tiny-test@", grpc::StatusCode::NOT_FOUND, "model: \"tiny-test@\" is not served"},
      {"tiny-test@" + fp.substr(0, 12) + "." + (tok[0] == 'f' ? "0" : "f"),
       grpc::StatusCode::NOT_FOUND, "is not served by this worker"},
      {"Tiny-Test", grpc::StatusCode::NOT_FOUND, "model: \"Tiny-Test\" is not served"},
      {std::string(257, 'm'), grpc::StatusCode::INVALID_ARGUMENT,
       "model: 257 bytes, over the limit of 256"},
      {"ti\xC3", grpc::StatusCode::INVALID_ARGUMENT, "model: not valid UTF-8 (byte 2)"},
  };
  for (const Case& c : cases) {
    v1::GenerateRequest r = Request(kDocs, 2);
    r.set_model(c.model);
    const StreamResult out = Generate(r);
    EXPECT_EQ(out.status.error_code(), c.code) << c.message;
    EXPECT_THAT(out.status.error_message(), HasSubstr(c.message));
    EXPECT_TRUE(out.chunks.empty()) << c.message;
  }
  EXPECT_EQ(Requests("not_found"), 5);
  EXPECT_EQ(Requests("invalid_argument"), 2);
  // Prefetch names its model the same way.
  {
    v1::PrefetchRequest p;
    *p.add_documents() = TextDoc(kDocs[0]);
    p.set_model("other-model");
    grpc::ClientContext ctx;
    v1::PrefetchResponse resp;
    const grpc::Status s = stub_->Prefetch(&ctx, p, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
    EXPECT_THAT(s.error_message(), HasSubstr("model: \"other-model\" is not served"));
    p.set_model("tiny-test");
    grpc::ClientContext ok_ctx;
    EXPECT_TRUE(stub_->Prefetch(&ok_ctx, p, &resp).ok());
  }
  // Routed by a router to this worker's model: the name it resolved is taken as it is (here
  // another worker of these weights reported "alias"), its form still checked.
  const std::string mine = ExpectedModelValue(fp, tok);
  for (const std::string& model :
       {std::string("alias"), std::string("tiny-test"), std::string("alias@") + fp.substr(0, 12)}) {
    grpc::ClientContext ctx;
    ctx.AddMetadata(kExpectedModelKey, mine);
    v1::GenerateRequest r = Request(kDocs, 2);
    r.set_model(model);
    auto reader = stub_->Generate(&ctx, r);
    v1::GenerateResponse m;
    while (reader->Read(&m)) {
    }
    const grpc::Status s = reader->Finish();
    EXPECT_TRUE(s.ok()) << model << ": " << s.error_message();
  }
  {
    grpc::ClientContext ctx;
    ctx.AddMetadata(kExpectedModelKey, mine);
    v1::GenerateRequest r = Request(kDocs, 2);
    r.set_model(std::string(300, 'a'));
    auto reader = stub_->Generate(&ctx, r);
    v1::GenerateResponse m;
    while (reader->Read(&m)) {
    }
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  }
  ExpectIdle();
}

}  // namespace
}  // namespace lazyattn
