// Requests the router refuses before a worker sees them: more than max_inflight_requests is
// RESOURCE_EXHAUSTED, and invalid UTF-8 or a malformed field is INVALID_ARGUMENT naming the field
// (invalid UTF-8 counted per field), on Generate, Complete and Prefetch alike; fields the router
// does not know are dropped before a worker sees them.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "google/protobuf/unknown_field_set.h"
#include "lazyattn/v1/inference.grpc.pb.h"
#include "services/router/server/router_server.h"
#include "services/router/server/router_server_test_fixture.h"
#include "services/router/server/unknown_fields.h"

namespace lazyattn::router {
namespace {

using lazyattn::v1::GenerateRequest;
using lazyattn::v1::GenerateResponse;
using ::testing::HasSubstr;
using testing::RouterServerTest;
using testing::StreamResult;

TEST_F(RouterServerTest, TooManyInFlightIsResourceExhausted) {
  StartWorkers(1);
  StartKvdir();
  workers_[0]->SetScript({.block = true});
  RouterOptions o = Options();
  o.max_inflight_requests = 1;
  StartRouter(o);

  grpc::ClientContext first_ctx;
  auto first = stub_->Generate(&first_ctx, Request({"doc"}));
  ASSERT_TRUE(workers_[0]->WaitForCalls(1, absl::Seconds(30)));

  StreamResult second = Stream(Request({"doc"}));
  EXPECT_EQ(second.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(second.status.error_message(), HasSubstr("max_inflight_requests"));

  workers_[0]->Unblock();
  GenerateResponse r;
  int tokens = 0;
  while (first->Read(&r)) tokens += r.has_token();
  EXPECT_TRUE(first->Finish().ok());
  EXPECT_EQ(tokens, 3);
}

// Text fields are `bytes` on the wire: the router checks their UTF-8 itself and names the field
// (a `string` field made the generated parser refuse the whole call with no message).
TEST_F(RouterServerTest, InvalidUtf8IsInvalidArgumentNamingTheFieldAndCounted) {
  StartWorkers(1);
  StartKvdir();
  StartRouter(Options());
  const std::string bad = "caf\xC3";  // cut short
  struct Case {
    std::function<void(GenerateRequest&)> edit;
    std::string field;
    std::string label;
  };
  const std::vector<Case> cases = {
      {[&](GenerateRequest& r) { r.set_system(bad); }, "system", "system"},
      {[&](GenerateRequest& r) { r.set_question(bad); }, "question", "question"},
      {[&](GenerateRequest& r) { r.mutable_documents(1)->set_id(bad); }, "documents[1].id",
       "documents.id"},
      {[&](GenerateRequest& r) { r.mutable_documents(1)->set_text(bad); }, "documents[1].text",
       "documents.text"},
      {[&](GenerateRequest& r) { r.mutable_sampling()->add_stop(bad); }, "sampling.stop[0]",
       "sampling.stop"},
  };
  for (const Case& c : cases) {
    GenerateRequest r = Request({"fine", "also fine"});
    c.edit(r);
    StreamResult streamed = Stream(r);
    EXPECT_EQ(streamed.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.field;
    EXPECT_THAT(streamed.status.error_message(), HasSubstr(c.field + ": not valid UTF-8"));
    grpc::ClientContext ctx;
    lazyattn::v1::CompleteResponse response;
    grpc::Status s = stub_->Complete(&ctx, r, &response);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.field;
    EXPECT_THAT(s.error_message(), HasSubstr(c.field + ": not valid UTF-8"));
  }
  for (const char* field : {"documents.id", "documents.text"}) {
    grpc::ClientContext ctx;
    lazyattn::v1::PrefetchRequest prefetch;
    auto* doc = prefetch.add_documents();
    doc->set_text("fine");
    if (std::string(field) == "documents.id") {
      doc->set_id(bad);
    } else {
      doc->set_text(bad);
    }
    lazyattn::v1::PrefetchResponse presp;
    grpc::Status s = stub_->Prefetch(&ctx, prefetch, &presp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << field;
    EXPECT_THAT(s.error_message(), HasSubstr("documents[0]."));
    EXPECT_THAT(s.error_message(), HasSubstr("not valid UTF-8"));
  }
  EXPECT_EQ(workers_[0]->generate_calls(), 0);
  EXPECT_EQ(workers_[0]->prefetch_calls(), 0);
  const std::string metrics = Metrics();
  for (const Case& c : cases) {
    const int expected = c.label.rfind("documents.", 0) == 0 ? 3 : 2;  // + one Prefetch each
    EXPECT_THAT(metrics, HasSubstr(absl::StrCat("lazyattn_router_invalid_utf8_requests_total{field=\"",
                                                c.label, "\"} ", expected)))
        << c.label;
  }
}

TEST_F(RouterServerTest, MalformedRequestsAreInvalidArgumentNamingTheField) {
  StartWorkers(1);
  StartKvdir();
  RouterOptions o = Options();
  o.limits.max_documents = 4;
  o.limits.max_document_bytes = 100;
  StartRouter(o);

  struct Case {
    GenerateRequest request;
    std::string field;
  };
  std::vector<Case> cases;
  {
    GenerateRequest r = Request({"a", "b", "c", "", "e"});
    r.mutable_documents()->RemoveLast();
    cases.push_back({r, "documents[3].text: empty document"});
  }
  cases.push_back({Request({"a", "b", "c", "d", "e"}), "documents: 5 documents, the limit is 4"});
  cases.push_back({Request({std::string(101, 'x')}), "documents[0].text: 101 bytes"});
  cases.push_back({Request({}, ""), "question: must not be empty"});
  cases.push_back({Request({"a"}, ""), "question: must not be empty"});
  {
    GenerateRequest r = Request({"a"});
    r.mutable_sampling()->set_temperature(-1);
    cases.push_back({r, "sampling.temperature"});
  }
  {
    GenerateRequest r = Request({"a"});
    r.mutable_sampling()->set_max_tokens(1 << 20);
    cases.push_back({r, "sampling.max_tokens"});
  }
  {
    GenerateRequest r = Request({"a"});
    r.set_cache_mode(static_cast<lazyattn::v1::CacheMode>(42));
    cases.push_back({r, "cache_mode: unknown cache mode 42"});
  }
  {
    GenerateRequest r = Request({"a"});
    r.mutable_documents(0)->mutable_tokens()->add_ids(5000);  // vocabulary of the fake: 1000
    cases.push_back({r, "documents[0].tokens.ids[0]: token id 5000 outside the vocabulary"});
  }
  for (const Case& c : cases) {
    StreamResult r = Stream(c.request);
    EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.field;
    EXPECT_THAT(r.status.error_message(), HasSubstr(c.field));
    grpc::ClientContext ctx;
    lazyattn::v1::CompleteResponse response;
    grpc::Status s = stub_->Complete(&ctx, c.request, &response);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.field;
  }
  EXPECT_EQ(workers_[0]->generate_calls(), 0);

  grpc::ClientContext ctx;
  lazyattn::v1::PrefetchRequest prefetch;
  prefetch.add_documents()->set_text("a");
  prefetch.set_replicas(-1);
  lazyattn::v1::PrefetchResponse presp;
  grpc::Status s = stub_->Prefetch(&ctx, prefetch, &presp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("replicas"));
}

google::protobuf::UnknownFieldSet* Unknown(google::protobuf::Message* message) {
  return message->GetReflection()->MutableUnknownFields(message);
}

// Fields this router's proto does not know pass none of its checks, so they never reach a worker
// (one built from a newer proto would act on them unchecked): a request carrying them, at the
// top and inside a document and the sampling parameters, is served, and what the worker gets has
// none left, its known fields untouched. Prefetch likewise.
TEST_F(RouterServerTest, FieldsThisRouterDoesNotKnowNeverReachAWorker) {
  StartWorkers(1);
  StartKvdir();
  StartRouter(Options());
  GenerateRequest request = Request({"doc"});
  Unknown(&request)->AddVarint(9001, 1);
  Unknown(request.mutable_documents(0))->AddLengthDelimited(9002, "unchecked");
  Unknown(request.mutable_sampling())->AddFixed32(9003, 7);
  ASSERT_TRUE(HasUnknownFields(request));
  StreamResult r = Stream(request);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  GenerateRequest forwarded =
      workers_[0]->generate_calls() > 0 ? workers_[0]->last_request() : workers_[1]->last_request();
  EXPECT_FALSE(HasUnknownFields(forwarded));
  GenerateRequest expected = request;
  expected.DiscardUnknownFields();
  EXPECT_EQ(forwarded.documents(0).text(), expected.documents(0).text());
  EXPECT_EQ(forwarded.question(), expected.question());
  EXPECT_EQ(forwarded.sampling().SerializeAsString(), expected.sampling().SerializeAsString());

  // A request without any is forwarded as it is (no copy is made; the fields all arrive).
  const GenerateRequest plain = Request({"doc"});
  EXPECT_FALSE(HasUnknownFields(plain));

  lazyattn::v1::PrefetchRequest prefetch;
  prefetch.add_documents()->set_text("a");
  Unknown(prefetch.mutable_documents(0))->AddVarint(9004, 3);
  Unknown(&prefetch)->AddVarint(9005, 3);
  grpc::ClientContext ctx;
  lazyattn::v1::PrefetchResponse presp;
  grpc::Status s = stub_->Prefetch(&ctx, prefetch, &presp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  const lazyattn::v1::PrefetchRequest sent = workers_[0]->last_prefetch_request();
  ASSERT_EQ(sent.documents_size(), 1);
  EXPECT_EQ(sent.documents(0).text(), "a");
  EXPECT_FALSE(HasUnknownFields(sent));
}

}  // namespace
}  // namespace lazyattn::router
