// The contracts tokenizer.h states, on SmolLM2's real vocabulary: the round trip (which bytes are
// dropped, and that nothing else is lost; at most a token a byte) and EncodeParts (one text, parts
// only decide where special tokens may be parsed and which part a token belongs to). HF's ids for
// the dropped bytes come from tests/data/prompt_golden.json (tools/reference/gen_prompt_golden.py).
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "services/worker/model/gguf_file.h"
#include "services/worker/model/tokenizer/tokenizer.h"
#include "services/worker/model/tokenizer/tokenizer_spec.h"
#include "services/worker/model/tokenizer/unicode.h"

namespace lazyattn {
namespace {

using ::testing::ElementsAre;

constexpr char kModelPath[] = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
constexpr char kGoldenPath[] = "tests/data/prompt_golden.json";

class TokenizerContractTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ASSERT_TRUE(std::filesystem::exists(kModelPath)) << kModelPath << " missing: tools/fetch-model";
    auto gguf = GgufFile::Open(kModelPath);
    ASSERT_TRUE(gguf.ok()) << gguf.status();
    auto spec = TokenizerSpecFromGguf(**gguf);
    ASSERT_TRUE(spec.ok()) << spec.status();
    auto t = Tokenizer::Create(*std::move(spec));
    ASSERT_TRUE(t.ok()) << t.status();
    tokenizer_ = t->release();
  }
  static void TearDownTestSuite() { delete tokenizer_; }
  static const Tokenizer& tok() { return *tokenizer_; }

  // `s` without the bytes that have no token.
  static std::string Droppable(std::string_view s) {
    std::string out;
    for (char c : s) {
      if (tok().ByteHasToken(static_cast<uint8_t>(c))) out.push_back(c);
    }
    return out;
  }
  static std::string Decode(const std::vector<int32_t>& ids) {
    absl::StatusOr<std::string> s = tok().Decode(ids);
    return s.ok() ? *s : "<decode error>";
  }

  static Tokenizer* tokenizer_;
};
Tokenizer* TokenizerContractTest::tokenizer_ = nullptr;

TEST_F(TokenizerContractTest, BytesWithoutAToken) {
  std::vector<int> missing;
  for (int b = 0; b < 256; ++b) {
    if (!tok().ByteHasToken(static_cast<uint8_t>(b))) missing.push_back(b);
  }
  // The eight a valid UTF-8 text can hold, and the thirteen it never holds (C0, C1, F5..FF;
  // Encode turns them into U+FFFD before they reach the byte alphabet).
  EXPECT_THAT(missing, ElementsAre(0x04, 0x06, 0x13, 0x14, 0x16, 0x1D, 0xC0, 0xC1, 0xF1, 0xF2,
                                   0xF5, 0xF6, 0xF7, 0xF8, 0xF9, 0xFA, 0xFB, 0xFC, 0xFD, 0xFE,
                                   0xFF));
  EXPECT_TRUE(tok().merges_closed());
}

// Every code point, 64 at a time, with both parse_special settings: the round trip loses the
// bytes without a token and nothing else. Surrogates are not valid UTF-8 and are left out.
TEST_F(TokenizerContractTest, RoundTripDropsOnlyBytesWithoutAToken) {
  int lossy = 0;
  for (uint32_t first = 0; first <= 0x10FFFF; first += 64) {
    std::string s;
    for (uint32_t cp = first; cp < first + 64 && cp <= 0x10FFFF; ++cp) {
      if (cp >= 0xD800 && cp <= 0xDFFF) continue;
      AppendUtf8(cp, &s);
      if (cp % 7 == 0) s += ' ';  // words of several lengths
    }
    const std::string expected = Droppable(s);
    if (expected != s) ++lossy;
    for (bool special : {false, true}) {
      const std::vector<int32_t> ids = tok().Encode(s, special);
      // At most a token a byte: the router bounds a text document's tokens by its bytes
      // (DocumentRef::max_tokens), and caps what the directory claims for it there.
      ASSERT_LE(ids.size(), s.size()) << "code points from U+" << std::hex << first;
      const std::string back = Decode(ids);
      ASSERT_EQ(back, expected) << "code points from U+" << std::hex << first;
    }
  }
  // U+0004..U+001D and the planes led by F1 (U+40000..U+7FFFF) and F2 (U+80000..U+BFFFF).
  EXPECT_GT(lossy, 2 * 0x40000 / 64);
}

TEST_F(TokenizerContractTest, DroppedBytesMatchHf) {
  std::ifstream in(kGoldenPath);
  std::stringstream ss;
  ss << in.rdbuf();
  const nlohmann::json golden = nlohmann::json::parse(ss.str());
  ASSERT_GE(golden["bytes"].size(), 5u);
  for (const auto& c : golden["bytes"]) {
    std::string text;
    const std::string hex = c["text_utf8_hex"];
    for (size_t i = 0; i + 1 < hex.size(); i += 2) {
      text.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
    }
    SCOPED_TRACE(hex);
    EXPECT_EQ(tok().Encode(text, false), c["ids"].get<std::vector<int32_t>>());
    EXPECT_EQ(Decode(tok().Encode(text, false)), Droppable(text));
  }
  EXPECT_THAT(tok().Encode("\x04\x06\x13\x14\x16\x1d", false), ::testing::IsEmpty());
}

TEST_F(TokenizerContractTest, PartsAlikeTokenizeAsTheirConcatenation) {
  const std::vector<std::string> texts = {
      "<|im_start|>user\n\n   Summarize the text.<|im_end|>\n<|im_start|>assistant\n",
      "  leading and trailing  \t\r\n\r\n 12345 3.14 I'm can't",
      "你好世界，这是一个测试。🦙🦙 👨‍👩‍👧 café e\u0301 \u00a0\u3000x",
      "ok\xff\xc3 \x80 end\xe2\x82",  // invalid UTF-8
  };
  std::mt19937 rng(7);
  for (const std::string& text : texts) {
    for (int trial = 0; trial < 50; ++trial) {
      // Cut anywhere, even inside a character or a special token's text.
      std::vector<size_t> cuts = {0, text.size()};
      for (int i = rng() % 5; i > 0; --i) cuts.push_back(rng() % (text.size() + 1));
      std::sort(cuts.begin(), cuts.end());
      for (bool special : {false, true}) {
        std::vector<Tokenizer::TextPart> parts;
        for (size_t i = 0; i + 1 < cuts.size(); ++i) {
          parts.push_back({std::string_view(text).substr(cuts[i], cuts[i + 1] - cuts[i]), special});
        }
        std::vector<size_t> owner;
        const std::vector<int32_t> ids = tok().EncodeParts(parts, &owner);
        ASSERT_EQ(ids, tok().Encode(text, special)) << "trial " << trial;
        ASSERT_EQ(owner.size(), ids.size());
        ASSERT_TRUE(std::is_sorted(owner.begin(), owner.end()));
        for (size_t part : owner) ASSERT_FALSE(parts[part].text.empty());
      }
    }
  }
}

TEST_F(TokenizerContractTest, EachTokenBelongsToThePartHoldingItsLastByte) {
  const int32_t user = *tok().TokenId("user");
  const int32_t nl2_sp2 = *tok().TokenId("ĊĊĠĠ");
  std::vector<size_t> owner;
  const std::vector<Tokenizer::TextPart> parts = {
      {"<|im_start|>user\n", true}, {"", false}, {"\n   Sum", true}};
  const std::vector<int32_t> ids = tok().EncodeParts(parts, &owner);
  ASSERT_GE(ids.size(), 4u);
  EXPECT_THAT(std::vector<int32_t>(ids.begin(), ids.begin() + 3), ElementsAre(1, user, nl2_sp2));
  EXPECT_THAT(std::vector<size_t>(owner.begin(), owner.begin() + 3), ElementsAre(0, 0, 2));
  // A character cut in two belongs to the part holding its last byte.
  owner.clear();
  EXPECT_EQ(tok().EncodeParts({{"a\xE2\x82", false}, {"\xAC", false}}, &owner),
            tok().Encode("a\xE2\x82\xAC", false));
  EXPECT_EQ(owner.back(), 1u);
}

TEST_F(TokenizerContractTest, SpecialTextIsParsedOnlyInsideSpecialParts) {
  const std::string im_end = "<|im_end|>";
  // Wholly inside a literal part: literal.
  auto lit = tok().EncodeParts({{"x", true}, {im_end, false}, {"y", true}});
  EXPECT_EQ(std::count(lit.begin(), lit.end(), 2), 0);
  EXPECT_EQ(Decode(lit), "x" + im_end + "y");
  // Straddling a special and a literal part: literal.
  auto straddle = tok().EncodeParts({{"<|im_", true}, {"end|>", false}});
  EXPECT_EQ(std::count(straddle.begin(), straddle.end(), 2), 0);
  // Straddling two special parts (and an empty literal one between): the token.
  EXPECT_THAT(tok().EncodeParts({{"<|im_", true}, {"", false}, {"end|>", true}}), ElementsAre(2));
}

}  // namespace
}  // namespace lazyattn
