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
  EXPECT_EQ(nlohmann::json::parse(ErrorBody(413, "body: too large", "body_too_large"))["error"]["type"],
            "invalid_request_error");
  // Client bytes quoted in a message need not be UTF-8: the body is still valid JSON.
  const std::string bad = ErrorBody(400, "model: \xff\xfe", "invalid_argument");
  EXPECT_FALSE(nlohmann::json::parse(bad, nullptr, false).is_discarded());
}

}  // namespace
}  // namespace lazyattn::router
