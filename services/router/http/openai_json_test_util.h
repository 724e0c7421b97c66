// Test-only helpers shared by the tests of the OpenAI JSON parser (openai_json.h).
#ifndef LAZYATTN_SERVICES_ROUTER_HTTP_OPENAI_JSON_TEST_UTIL_H_
#define LAZYATTN_SERVICES_ROUTER_HTTP_OPENAI_JSON_TEST_UTIL_H_

#include <string>

#include "gtest/gtest.h"
#include "services/router/http/openai_json.h"

namespace lazyattn::router::testing {

// "ok" when `body` parses as a request of `kind`, else its error message (which must be an
// InvalidArgument).
inline std::string ErrorOf(ApiKind kind, const std::string& body) {
  auto r = ParseOpenAiRequest(kind, body);
  if (r.ok()) return "ok";
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(r.status().message());
}

}  // namespace lazyattn::router::testing

#endif  // LAZYATTN_SERVICES_ROUTER_HTTP_OPENAI_JSON_TEST_UTIL_H_
