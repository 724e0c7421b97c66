#include "common/model_id.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

namespace lazyattn {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

TEST(ModelIdTest, TheFieldIsBoundedUtf8) {
  EXPECT_TRUE(CheckModelField("").ok());
  EXPECT_TRUE(CheckModelField(std::string(kMaxModelBytes, 'x')).ok());
  EXPECT_TRUE(CheckModelField("smollm2-135m@9f3a.\xC3\xA9").ok());

  const absl::Status too_long = CheckModelField(std::string(kMaxModelBytes + 1, 'x'));
  EXPECT_EQ(too_long.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(too_long.message()), StartsWith("model: 257 bytes"));

  const absl::Status not_utf8 = CheckModelField("ab\xFF");
  EXPECT_EQ(not_utf8.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(not_utf8.message()), HasSubstr("model: not valid UTF-8 (byte 2)"));
}

TEST(ModelIdTest, AQuoteKeepsAtMost64BytesAndNeverSplitsACharacter) {
  EXPECT_EQ(QuoteModelValue("llama"), "\"llama\"");
  EXPECT_EQ(QuoteModelValue(std::string(64, 'a')), "\"" + std::string(64, 'a') + "\"");
  EXPECT_EQ(QuoteModelValue(std::string(65, 'a')), "\"" + std::string(64, 'a') + "...\"");
  // 63 ASCII bytes, then a two-byte character across the 64-byte cut: the cut moves before it.
  const std::string across = std::string(63, 'a') + "\xC3\xA9" + "tail";
  EXPECT_EQ(QuoteModelValue(across), "\"" + std::string(63, 'a') + "...\"");
}

TEST(ModelIdTest, ASelectorSplitsAtTheLastAtAndTheFirstDotAfterIt) {
  auto both = ParseFingerprintSelector("org@team/llama@AB12.cd.9");
  ASSERT_TRUE(both.has_value());
  EXPECT_EQ(both->name, "org@team/llama");
  EXPECT_EQ(both->model_prefix, "AB12");
  EXPECT_EQ(both->tokenizer_prefix, "cd.9");

  auto model_only = ParseFingerprintSelector("@ab");
  ASSERT_TRUE(model_only.has_value());
  EXPECT_EQ(model_only->name, "");
  EXPECT_EQ(model_only->model_prefix, "ab");
  EXPECT_EQ(model_only->tokenizer_prefix, "");

  EXPECT_FALSE(ParseFingerprintSelector("llama").has_value());
  EXPECT_FALSE(ParseFingerprintSelector("llama@").has_value());
  EXPECT_FALSE(ParseFingerprintSelector("llama@.ab").has_value());
}

TEST(ModelIdTest, ASelectorMatchesFingerprintPrefixesIgnoringCase) {
  const auto selector = ParseFingerprintSelector("llama@AB12.Cd");
  ASSERT_TRUE(selector.has_value());
  EXPECT_TRUE(SelectsFingerprints(*selector, "ab12ef", "cdef"));
  EXPECT_FALSE(SelectsFingerprints(*selector, "ab13ef", "cdef"));
  EXPECT_FALSE(SelectsFingerprints(*selector, "ab12ef", "ce"));
  EXPECT_FALSE(SelectsFingerprints(*selector, "ab1", "cdef"));  // P longer than the fingerprint

  const auto any_tokenizer = ParseFingerprintSelector("llama@ab");
  ASSERT_TRUE(any_tokenizer.has_value());
  EXPECT_TRUE(SelectsFingerprints(*any_tokenizer, "ab12", ""));
}

}  // namespace
}  // namespace lazyattn
