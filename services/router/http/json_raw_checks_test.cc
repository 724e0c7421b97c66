// The raw-body checks before parsing, against hostile bodies: the depth rule at its edge, whatever
// strings and escapes hold; a NUL anywhere; bodies broken in other ways pass on to the parser.
#include "services/router/http/json_raw_checks.h"

#include <gtest/gtest.h>

#include <string>

namespace lazyattn::router {
namespace {

constexpr int kDepth = 4;

std::string Nested(int n, const std::string& inner) {
  return std::string(n, '[') + inner + std::string(n, ']');
}

TEST(JsonRawChecksTest, DepthIsTheParsersRuleAtItsEdge) {
  EXPECT_TRUE(CheckRawJson(Nested(kDepth, "1"), kDepth).ok());
  EXPECT_TRUE(CheckRawJson(Nested(kDepth + 1, ""), kDepth).ok());  // the innermost empty
  for (const std::string& body : {Nested(kDepth + 1, "1"), Nested(kDepth + 1, "[]"),
                                  Nested(kDepth + 2, ""), std::string(100000, '{')}) {
    const absl::Status s = CheckRawJson(body, kDepth);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << body.substr(0, 20);
    EXPECT_EQ(s.message(), "body: JSON nested deeper than 4 levels");
  }
}

TEST(JsonRawChecksTest, StringsAndEscapesAreText) {
  const std::string deep = std::string(50, '[') + std::string(50, '{');
  EXPECT_TRUE(CheckRawJson("[\"" + deep + "\"]", kDepth).ok());
  // An escaped quote does not end the string; an escaped backslash does not escape the quote.
  EXPECT_TRUE(CheckRawJson("[\"\\\"" + deep + "\"]", kDepth).ok());
  EXPECT_FALSE(CheckRawJson("[\"\\\\\"" + deep + "]", kDepth).ok());
}

TEST(JsonRawChecksTest, ANulByteAnywhereIsRefusedWithItsOffset) {
  for (const std::string& body :
       {std::string("{\"a\":1}\0garbage", 15), std::string("{\"a\":\"x\0y\"}", 11)}) {
    const absl::Status s = CheckRawJson(body, kDepth);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("a NUL byte at offset"), std::string::npos) << s.message();
  }
}

// Broken in other ways (unmatched closers, an unterminated string, a trailing backslash): not the
// scan's to judge, and nothing it reads past the end.
TEST(JsonRawChecksTest, OtherFaultsAreLeftToTheParser) {
  for (const char* body : {"]]]]]]]]}}}}", "[\"unterminated", "[\"\\", "", "{\"a\":1}}}[[["}) {
    EXPECT_TRUE(CheckRawJson(body, kDepth).ok()) << body;
  }
}

}  // namespace
}  // namespace lazyattn::router
