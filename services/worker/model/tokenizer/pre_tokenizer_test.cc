// Pre-tokenizer behaviour every model relies on (whitespace, invalid UTF-8, empty and random
// input, the names a spec may give); the per-model reference splits are in
// pre_tokenizer_{gpt2,smollm,llama3}_test.cc.
#include "services/worker/model/tokenizer/pre_tokenizer.h"

#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/worker/model/tokenizer/unicode.h"

namespace lazyattn {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(PreTokenizerTest, WhitespaceBeforeWordKeepsOneSpace) {
  // \s+(?!\S) leaves the last space to prefix the next word.
  EXPECT_THAT(PreTokenize(PreTokenizerType::kGpt2, "a    b"), ElementsAre("a", "   ", " b"));
  EXPECT_THAT(PreTokenize(PreTokenizerType::kLlama3, "a    b"), ElementsAre("a", "   ", " b"));
  EXPECT_THAT(PreTokenize(PreTokenizerType::kLlama3, "a  \n\n  b"),
              ElementsAre("a", "  \n\n", " ", " b"));
}

TEST(PreTokenizerTest, InvalidUtf8BecomesReplacementCharacters) {
  // Each bad byte is one U+FFFD (an "other" character), as in llama.cpp.
  const std::string bad = "ab\xff\xfe cd\xc3";
  EXPECT_THAT(PreTokenize(PreTokenizerType::kGpt2, bad),
              ElementsAre("ab", "\xEF\xBF\xBD\xEF\xBF\xBD", " cd", "\xEF\xBF\xBD"));
}

TEST(PreTokenizerTest, EmptyInput) {
  EXPECT_TRUE(PreTokenize(PreTokenizerType::kSmolLM, "").empty());
  EXPECT_TRUE(PreTokenize(PreTokenizerType::kLlama3, "").empty());
}

TEST(PreTokenizerTest, WordsPartitionRandomInput) {
  // Random mixes of classes: the words must be non-empty and concatenate to the decoded input.
  const std::vector<std::string> atoms = {
      "a", "Z", " ", "  ", "\n", "\r\n", "\t",   "'",      "'s",     "7", "42",
      "!", "?", ".", "é",  "中", "🦙", "\xff", "\u00a0", "\u3000", "٣", "'LL"};
  std::mt19937 rng(1234);
  for (int iter = 0; iter < 300; ++iter) {
    std::string text;
    const int len = static_cast<int>(rng() % 40);
    for (int i = 0; i < len; ++i) text += atoms[rng() % atoms.size()];
    std::string decoded;
    for (uint32_t cp : DecodeUtf8Lenient(text)) AppendUtf8(cp, &decoded);
    for (PreTokenizerType type :
         {PreTokenizerType::kGpt2, PreTokenizerType::kSmolLM, PreTokenizerType::kLlama3}) {
      std::string joined;
      for (const std::string& w : PreTokenize(type, text)) {
        ASSERT_FALSE(w.empty()) << text;
        joined += w;
      }
      EXPECT_EQ(joined, decoded) << PreTokenizerTypeName(type);
    }
  }
}

TEST(PreTokenizerTest, Names) {
  EXPECT_EQ(*PreTokenizerTypeFromName("smollm"), PreTokenizerType::kSmolLM);
  EXPECT_EQ(*PreTokenizerTypeFromName("llama-bpe"), PreTokenizerType::kLlama3);
  EXPECT_EQ(*PreTokenizerTypeFromName("gpt-2"), PreTokenizerType::kGpt2);
  absl::StatusOr<PreTokenizerType> bad = PreTokenizerTypeFromName("qwen2");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("qwen2"));
  EXPECT_FALSE(PreTokenizerTypeFromName("default").ok());
}

}  // namespace
}  // namespace lazyattn
