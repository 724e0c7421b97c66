// gRPC statuses -> HTTP statuses and OpenAI's error body.
#include "services/router/http/error_mapping.h"

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace lazyattn::router {
namespace {

TEST(ErrorMappingTest, EveryCodeHasItsHttpStatus) {
  using C = grpc::StatusCode;
  EXPECT_EQ(HttpStatusOf(C::OK), 200);
  EXPECT_EQ(HttpStatusOf(C::INVALID_ARGUMENT), 400);
  EXPECT_EQ(HttpStatusOf(C::FAILED_PRECONDITION), 400);
  EXPECT_EQ(HttpStatusOf(C::OUT_OF_RANGE), 400);
  EXPECT_EQ(HttpStatusOf(C::UNAUTHENTICATED), 401);
  EXPECT_EQ(HttpStatusOf(C::PERMISSION_DENIED), 403);
  EXPECT_EQ(HttpStatusOf(C::NOT_FOUND), 404);
  EXPECT_EQ(HttpStatusOf(C::UNIMPLEMENTED), 404);
  EXPECT_EQ(HttpStatusOf(C::RESOURCE_EXHAUSTED), 429);
  EXPECT_EQ(HttpStatusOf(C::UNAVAILABLE), 503);
  EXPECT_EQ(HttpStatusOf(C::DEADLINE_EXCEEDED), 504);
  EXPECT_EQ(HttpStatusOf(C::CANCELLED), 499);
  EXPECT_EQ(HttpStatusOf(C::INTERNAL), 500);
  EXPECT_EQ(HttpStatusOf(C::UNKNOWN), 500);
  EXPECT_EQ(HttpStatusOf(C::DATA_LOSS), 500);
  EXPECT_EQ(HttpStatusOf(C::ABORTED), 500);
}

TEST(ErrorMappingTest, ParamIsTheLeadingFieldName) {
  EXPECT_EQ(ParamOf("documents[2].text: empty document"), "documents[2].text");
  EXPECT_EQ(ParamOf("max_tokens: must be at least 1, got 0"), "max_tokens");
  EXPECT_EQ(ParamOf("router busy: 64 requests in flight"), "");  // a space: not a field
  EXPECT_EQ(ParamOf("no colon at all"), "");
  EXPECT_EQ(ParamOf(": nothing before"), "");
  EXPECT_EQ(ParamOf(""), "");
  EXPECT_EQ(ParamOf("logit_bias: key \"7\": bias 101 outside [-100, 100]"), "logit_bias");
  // A field name is followed by ": ", as every "<field>: <what>" message has it; a URL's scheme
  // (a message quoting a client's absolute-form target) is not one.
  EXPECT_EQ(ParamOf("https://evil/v1/models: no such endpoint"), "");
  EXPECT_EQ(ParamOf("n:1"), "");
  EXPECT_EQ(ParamOf("n:"), "");
}

TEST(ErrorMappingTest, OpenAiErrorShape) {
  const auto j = nlohmann::json::parse(
      ErrorBodyOf(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "n: only 1 choice")));
  EXPECT_EQ(j["error"]["message"], "n: only 1 choice");
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_EQ(j["error"]["param"], "n");
  EXPECT_EQ(j["error"]["code"], "invalid_argument");
  const auto busy = nlohmann::json::parse(
      ErrorBodyOf(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "router busy: retry")));
  EXPECT_EQ(busy["error"]["type"], "rate_limit_error");
  EXPECT_TRUE(busy["error"]["param"].is_null());
  EXPECT_EQ(busy["error"]["code"], "resource_exhausted");
  EXPECT_EQ(
      nlohmann::json::parse(ErrorBody(413, "body: too large", "body_too_large"))["error"]["type"],
      "invalid_request_error");
  // Client bytes quoted in a message need not be UTF-8: the body is still valid JSON.
  const std::string bad = ErrorBody(400, "model: \xff\xfe", "invalid_argument");
  EXPECT_FALSE(nlohmann::json::parse(bad, nullptr, false).is_discarded());
}

TEST(ErrorMappingTest, ServerErrorsHideInternalDetails) {
  const grpc::Status unavailable(grpc::StatusCode::UNAVAILABLE,
                                 "all 2 attempts failed: worker 10.1.2.3:7001: connection reset");
  const std::string body = ErrorBodyOf(unavailable);
  EXPECT_EQ(body.find("10.1.2.3"), std::string::npos) << body;
  EXPECT_EQ(nlohmann::json::parse(body)["error"]["type"], "service_unavailable_error");
  const std::string internal =
      ErrorBodyOf(grpc::Status(grpc::StatusCode::INTERNAL, "std::bad_alloc at worker w0:1"));
  EXPECT_EQ(internal.find("bad_alloc"), std::string::npos) << internal;
  EXPECT_EQ(internal.find("w0:1"), std::string::npos) << internal;
  const std::string late =
      ErrorBodyOf(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "worker 10.9.9.9:1 slow"));
  EXPECT_EQ(late.find("10.9.9.9"), std::string::npos) << late;
  // Client errors keep their message: it names the field.
  EXPECT_EQ(ClientMessageOf(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "n: only 1")),
            "n: only 1");
}

}  // namespace
}  // namespace lazyattn::router
