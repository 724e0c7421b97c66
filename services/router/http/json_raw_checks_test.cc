// The raw-body checks before parsing, against hostile bodies: the depth rule at its edge, whatever
// strings and escapes hold; a NUL anywhere; bodies broken in other ways pass on to the parser.
#include "services/router/http/json_raw_checks.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

namespace lazyattn::router {
namespace {

constexpr int kDepth = 4;
constexpr int64_t kElements = 1 << 20;

std::string Nested(int n, const std::string& inner) {
  return std::string(n, '[') + inner + std::string(n, ']');
}

TEST(JsonRawChecksTest, DepthIsTheParsersRuleAtItsEdge) {
  EXPECT_TRUE(CheckRawJson(Nested(kDepth, "1"), kDepth, kElements).ok());
  EXPECT_TRUE(CheckRawJson(Nested(kDepth + 1, ""), kDepth, kElements).ok());  // the innermost empty
  for (const std::string& body : {Nested(kDepth + 1, "1"), Nested(kDepth + 1, "[]"),
                                  Nested(kDepth + 2, ""), std::string(100000, '{')}) {
    const absl::Status s = CheckRawJson(body, kDepth, kElements);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << body.substr(0, 20);
    EXPECT_EQ(s.message(), "body: JSON nested deeper than 4 levels");
  }
}

TEST(JsonRawChecksTest, StringsAndEscapesAreText) {
  const std::string deep = std::string(50, '[') + std::string(50, '{');
  EXPECT_TRUE(CheckRawJson("[\"" + deep + "\"]", kDepth, kElements).ok());
  // An escaped quote does not end the string; an escaped backslash does not escape the quote.
  EXPECT_TRUE(CheckRawJson("[\"\\\"" + deep + "\"]", kDepth, kElements).ok());
  EXPECT_FALSE(CheckRawJson("[\"\\\\\"" + deep + "]", kDepth, kElements).ok());
}

TEST(JsonRawChecksTest, ANulByteAnywhereIsRefusedWithItsOffset) {
  for (const std::string& body :
       {std::string("{\"a\":1}\0garbage", 15), std::string("{\"a\":\"x\0y\"}", 11)}) {
    const absl::Status s = CheckRawJson(body, kDepth, kElements);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("a NUL byte at offset"), std::string::npos) << s.message();
  }
}

// Each '[', '{' and ',' outside strings counts; the limit itself passes, one more is refused, and
// separators inside strings are text.
TEST(JsonRawChecksTest, ValuesAreBoundedBeforeTheTreeIsBuilt) {
  constexpr int64_t kLimit = 10;
  const std::string at_limit = "[{},{},{},[1,2],3]";  // 1 + 3 x 2 + 3
  EXPECT_TRUE(CheckRawJson(at_limit, kDepth, kLimit).ok()) << at_limit;
  const std::string over = "[" + std::string(kLimit, ',') + "]";
  const absl::Status s = CheckRawJson(over, kDepth, kLimit);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "body: more than 10 JSON values (lists, objects and their entries); no request needs "
            "that many");
  EXPECT_TRUE(
      CheckRawJson("[\"" + std::string(1000, ',') + std::string(100, '{') + "\"]", kDepth, kLimit)
          .ok());
}

// Broken in other ways (unmatched closers, an unterminated string, a trailing backslash): not the
// scan's to judge, and nothing it reads past the end.
TEST(JsonRawChecksTest, OtherFaultsAreLeftToTheParser) {
  for (const char* body : {"]]]]]]]]}}}}", "[\"unterminated", "[\"\\", "", "{\"a\":1}}}[[["}) {
    EXPECT_TRUE(CheckRawJson(body, kDepth, kElements).ok()) << body;
  }
}

}  // namespace
}  // namespace lazyattn::router
