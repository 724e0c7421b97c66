// The Unicode helpers the pre-tokenizer and the streaming decoder build on: character classes
// from the generated tables, lenient UTF-8 decoding and the complete-prefix rule.
#include "services/worker/model/tokenizer/unicode.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lazyattn {
namespace {

using ::testing::ElementsAre;

TEST(UnicodeTest, Classes) {
  EXPECT_TRUE(IsLetter('a'));
  EXPECT_TRUE(IsLetter(0x4E2D));   // 中
  EXPECT_TRUE(IsLetter(0x00E9));   // é
  EXPECT_FALSE(IsLetter(0x0301));  // combining acute (Mn)
  EXPECT_TRUE(IsNumber('7'));
  EXPECT_TRUE(IsNumber(0x00B2));  // ²
  EXPECT_TRUE(IsNumber(0x216B));  // Ⅻ
  EXPECT_TRUE(IsWhitespace(0x3000));
  EXPECT_TRUE(IsWhitespace(0x0085));
  EXPECT_FALSE(IsWhitespace(0x001C));     // str.isspace() but not White_Space
  EXPECT_FALSE(IsWhitespace(0x200B));     // zero width space is Cf
  EXPECT_EQ(CodepointFlags(0x1F999), 0);  // 🦙
  EXPECT_EQ(CodepointFlags(0x110000), 0);
  EXPECT_STREQ(UnicodeTablesVersion(), "15.1.0");
}

TEST(UnicodeTest, LenientDecoding) {
  EXPECT_THAT(DecodeUtf8Lenient("a\xC3\xA9\xF0\x9F\xA6\x99"), ElementsAre('a', 0xE9, 0x1F999));
  EXPECT_THAT(DecodeUtf8Lenient("\x80\xC3"), ElementsAre(0xFFFD, 0xFFFD));
  EXPECT_THAT(DecodeUtf8Lenient("\xF4\x90\x80\x80"),  // above U+10FFFF
              ElementsAre(0xFFFD, 0xFFFD, 0xFFFD, 0xFFFD));
}

TEST(UnicodeTest, CompletePrefix) {
  const std::string llama = "\xF0\x9F\xA6\x99";
  EXPECT_EQ(Utf8CompletePrefixLength("ab"), 2u);
  EXPECT_EQ(Utf8CompletePrefixLength("ab" + llama.substr(0, 1)), 2u);
  EXPECT_EQ(Utf8CompletePrefixLength("ab" + llama.substr(0, 3)), 2u);
  EXPECT_EQ(Utf8CompletePrefixLength("ab" + llama), 6u);
  EXPECT_EQ(Utf8CompletePrefixLength("\x80\x80"), 2u);  // stray continuations: nothing to wait for
  EXPECT_EQ(Utf8CompletePrefixLength("a\xFF"), 2u);
  EXPECT_EQ(Utf8CompletePrefixLength("a\xE0\x80"), 3u);  // E0 80 can never be valid
}

}  // namespace
}  // namespace lazyattn
