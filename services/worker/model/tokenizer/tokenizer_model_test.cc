// Tests against real vocabularies, from the repository root (lazyattn_cc_test sets the working
// directory):
//   models/SmolLM2-135M-Instruct.Q4_1.gguf  (tools/fetch-model)
//   tests/data/tokenizer_golden.json       ids from llama.cpp (llama-cpp-python), all cases
//   models/ggml-vocab-{llama-bpe,gpt-2,starcoder}.gguf{,.inp,.out}
//       llama.cpp's own tokenizer test vocabularies and expected ids (tools/fetch-test-vocabs)
// Each test skips with a message when its files are absent.
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "services/worker/model/gguf_file.h"
#include "services/worker/model/tokenizer/chat_template.h"
#include "services/worker/model/tokenizer/tokenizer.h"
#include "services/worker/model/tokenizer/tokenizer_spec.h"
#include "services/worker/model/tokenizer/unicode.h"

namespace lazyattn {
namespace {

using ::testing::ElementsAre;
using ::testing::UnorderedElementsAre;

constexpr char kSmolLM2ModelPath[] = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
constexpr char kGoldenPath[] = "tests/data/tokenizer_golden.json";

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadGgufTokenizer(const std::string& path) {
  absl::StatusOr<std::unique_ptr<GgufFile>> gguf = GgufFile::Open(path);
  if (!gguf.ok()) return gguf.status();
  absl::StatusOr<TokenizerSpec> spec = TokenizerSpecFromGguf(**gguf);
  if (!spec.ok()) return spec.status();
  return Tokenizer::Create(*std::move(spec));
}

// One SmolLM2 tokenizer for the whole suite (loading takes ~100 ms).
class SmolLM2Test : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!std::filesystem::exists(kSmolLM2ModelPath)) return;
    const char* path = kSmolLM2ModelPath;
    absl::StatusOr<std::unique_ptr<Tokenizer>> t = LoadGgufTokenizer(path);
    ASSERT_TRUE(t.ok()) << t.status();
    tokenizer_ = t->release();
  }
  static void TearDownTestSuite() {
    delete tokenizer_;
    tokenizer_ = nullptr;
  }
  void SetUp() override {
    if (tokenizer_ == nullptr) {
      GTEST_SKIP() << kSmolLM2ModelPath << " is absent (tools/fetch-model fetches it)";
    }
  }
  static const Tokenizer& tok() { return *tokenizer_; }
  static Tokenizer* tokenizer_;
};
Tokenizer* SmolLM2Test::tokenizer_ = nullptr;

TEST_F(SmolLM2Test, Metadata) {
  EXPECT_EQ(tok().vocab_size(), 49152);
  EXPECT_EQ(tok().pre_tokenizer(), PreTokenizerType::kSmolLM);
  EXPECT_EQ(tok().bos_id(), 1);
  EXPECT_EQ(tok().eos_id(), 2);
  EXPECT_EQ(tok().eot_id(), 2);
  EXPECT_FALSE(tok().add_bos());
  // llama.cpp's EOG set for this vocabulary: <|endoftext|>, <|im_end|>, <reponame> (FIM repo).
  EXPECT_THAT(tok().end_of_generation_ids(), UnorderedElementsAre(0, 2, 4));
  EXPECT_EQ(tok().TokenText(1), "<|im_start|>");
  EXPECT_EQ(tok().token_type(1), TokenType::kControl);
}

// Ids checked against llama.cpp (llama-cpp-python 0.3.36, vocab_only, add_bos=False).
TEST_F(SmolLM2Test, KnownIds) {
  EXPECT_THAT(tok().Encode("Hello world", true), ElementsAre(19556, 905));
  const std::string chat = "<|im_start|>user\nWhat is 2+2?<|im_end|>\n";
  EXPECT_THAT(tok().Encode(chat, true),
              ElementsAre(1, 4093, 198, 1780, 314, 216, 34, 27, 34, 47, 2, 198));
  EXPECT_THAT(tok().Encode(chat, false),
              ElementsAre(44, 108, 306, 79, 3738, 108, 46, 4093, 198, 1780, 314, 216, 34, 27, 34,
                          15137, 108, 306, 79, 486, 108, 46, 198));
  EXPECT_THAT(tok().Encode(" 12345 apples", false), ElementsAre(216, 33, 34, 35, 36, 37, 13855));
  EXPECT_THAT(tok().Encode("I'm   fine\n\n", false), ElementsAre(57, 5248, 256, 4979, 1116));
  EXPECT_THAT(tok().Encode("🦙 café 你好", false),
              ElementsAre(10813, 116, 243, 37366, 216, 18645, 250, 48392, 138));
  EXPECT_THAT(tok().Encode("\xff", false), ElementsAre(24211));  // U+FFFD
}

TEST_F(SmolLM2Test, ChatTemplateFromModel) {
  absl::StatusOr<ChatTemplate> t = ChatTemplate::FromJinja(tok().chat_template());
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->name(), "smollm2");
  absl::StatusOr<std::string> prompt = t->Apply({{"user", "What is 2+2?"}}, true);
  ASSERT_TRUE(prompt.ok());
  const std::vector<int32_t> ids = tok().EncodeWithSpecials(*prompt, /*parse_special=*/true);
  EXPECT_EQ(ids.front(), 1);  // <|im_start|>, no BOS added (add_bos is false)
  EXPECT_EQ(*tok().Decode(ids), *prompt);
}

TEST_F(SmolLM2Test, StreamingMatchesDecode) {
  const std::string text =
      "Emoji 🦙🔥 and CJK 你好世界 and accents ÅÉÎ and math ∑∫√.";
  const std::vector<int32_t> ids = tok().Encode(text, false);
  StreamingDecoder dec(&tok());
  std::string out;
  for (int32_t id : ids) out += *dec.Push(id);
  out += dec.Flush();
  EXPECT_EQ(out, text);
}

// 100 KB of English must encode in well under a second (target: a few ms per 10 KB).
TEST_F(SmolLM2Test, PerformanceOnLongInputs) {
  const std::string paragraph =
      "The quick brown fox jumps over the lazy dog. In 2024, researchers reported that large "
      "language models can summarize documents of 100,000 tokens; however, tokenization must "
      "remain fast! Isn't it? Let's see: 3.14159 * 2 = 6.28318.\n\n";
  std::string english;
  int i = 0;
  while (english.size() < 100 * 1024)
    english += paragraph + "Section " + std::to_string(i++) + "\n";
  auto start = std::chrono::steady_clock::now();
  const std::vector<int32_t> ids = tok().Encode(english, true);
  const double english_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(english_s, 0.5) << ids.size() << " tokens";
  EXPECT_EQ(*tok().Decode(ids), english);

  // Pathological single words: 100 KB without spaces (one \p{L}+ word) and a long space run.
  std::string cjk;
  while (cjk.size() < 100 * 1024) cjk += "中文测试数据";
  std::string spaces(50000, ' ');
  for (const std::string* s : {&cjk, &spaces}) {
    start = std::chrono::steady_clock::now();
    const std::vector<int32_t> long_ids = tok().Encode(*s, false);
    const double s_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_LT(s_s, 1.0);
    EXPECT_EQ(*tok().Decode(long_ids), *s);
  }
}

std::string FromHex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  }
  return out;
}

// Every case of tests/data/tokenizer_golden.json (generated with llama.cpp): ids with and without
// special-token parsing, and an exact round trip.
TEST_F(SmolLM2Test, GoldenFile) {
  if (!std::filesystem::exists(kGoldenPath)) {
    GTEST_SKIP() << kGoldenPath << " is absent";
  }
  const nlohmann::json golden = nlohmann::json::parse(ReadAll(kGoldenPath), nullptr, false);
  ASSERT_FALSE(golden.is_discarded()) << kGoldenPath << " is not valid JSON";
  ASSERT_TRUE(golden.contains("cases"));
  int n = 0;
  for (const nlohmann::json& c : golden["cases"]) {
    const std::string text = c.contains("text_utf8_hex")
                                 ? FromHex(c["text_utf8_hex"].get<std::string>())
                                 : c["text"].get<std::string>();
    const std::vector<int32_t> special = c["ids_special"].get<std::vector<int32_t>>();
    const std::vector<int32_t> plain = c["ids_plain"].get<std::vector<int32_t>>();
    EXPECT_EQ(tok().Encode(text, true), special) << "case " << n << ": " << c["text"].dump();
    EXPECT_EQ(tok().Encode(text, false), plain) << "case " << n << ": " << c["text"].dump();
    EXPECT_EQ(*tok().Decode(tok().Encode(text, true)), text) << "case " << n;
    EXPECT_EQ(*tok().Decode(tok().Encode(text, false)), text) << "case " << n;
    ++n;
  }
  EXPECT_GT(n, 0);
}

// llama.cpp's own tokenizer regression data (models/ggml-vocab-*.gguf{,.inp,.out}): the inputs are
// separated by "\n__ggml_vocab_test__\n", the outputs are one line of ids per input, tokenized with
// add_special=false, parse_special=false.
void CheckLlamaCppVocab(const std::string& name) {
  const std::string path = "models/ggml-vocab-" + name + ".gguf";
  if (!std::filesystem::exists(path) || !std::filesystem::exists(path + ".inp")) {
    GTEST_SKIP() << path << "{,.inp,.out} absent (tools/fetch-test-vocabs fetches them)";
  }
  absl::StatusOr<std::unique_ptr<Tokenizer>> t = LoadGgufTokenizer(path);
  ASSERT_TRUE(t.ok()) << t.status();
  const std::string inp = ReadAll(path + ".inp");
  std::vector<std::string> inputs;
  const std::string sep = "\n__ggml_vocab_test__\n";
  for (size_t pos = 0; pos < inp.size();) {
    const size_t next = inp.find(sep, pos);
    inputs.push_back(inp.substr(pos, next == std::string::npos ? std::string::npos : next - pos));
    if (next == std::string::npos) break;
    pos = next + sep.size();
  }
  std::ifstream out(path + ".out");
  std::vector<std::vector<int32_t>> outputs;
  for (std::string line; std::getline(out, line);) {
    std::istringstream ids(line);
    std::vector<int32_t> v;
    for (int32_t id; ids >> id;) v.push_back(id);
    outputs.push_back(v);
  }
  ASSERT_EQ(inputs.size(), outputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    EXPECT_EQ((*t)->Encode(inputs[i], false), outputs[i])
        << name << " case " << i << ": \"" << inputs[i] << "\"";
  }
}

TEST(LlamaCppVocabTest, LlamaBpe) { CheckLlamaCppVocab("llama-bpe"); }
TEST(LlamaCppVocabTest, Gpt2) { CheckLlamaCppVocab("gpt-2"); }
TEST(LlamaCppVocabTest, StarCoder) { CheckLlamaCppVocab("starcoder"); }

// At most a token a byte (tokenizer.h) on these vocabularies too, not only SmolLM2's
// (tokenizer_contract_test): the router bounds a text document's tokens by its bytes and caps
// what the directory claims for it there (DocumentRef::max_tokens). Short texts, where a token
// too many shows most: every byte alone (lone UTF-8 pieces included), every code point of the
// BMP alone and after a space, and every 16th beyond; then every code point, in runs of 64 with
// spaces between words of several lengths. With and without special-token parsing.
void CheckAtMostATokenAByte(const std::string& name) {
  const std::string path = "models/ggml-vocab-" + name + ".gguf";
  if (!std::filesystem::exists(path)) {
    GTEST_SKIP() << path << " absent (tools/fetch-test-vocabs fetches it)";
  }
  absl::StatusOr<std::unique_ptr<Tokenizer>> t = LoadGgufTokenizer(path);
  ASSERT_TRUE(t.ok()) << t.status();
  auto check = [&](const std::string& s) {
    for (bool special : {false, true}) {
      ASSERT_LE((*t)->Encode(s, special).size(), s.size())
          << name << ": \"" << s << "\" (" << s.size() << " bytes)";
    }
  };
  for (int byte = 0; byte < 256; ++byte) {
    ASSERT_NO_FATAL_FAILURE(check(std::string(1, static_cast<char>(byte))));
  }
  for (uint32_t cp = 0; cp <= 0x10FFFF; cp += cp < 0x10000 ? 1 : 16) {
    if (cp >= 0xD800 && cp <= 0xDFFF) continue;
    std::string s;
    AppendUtf8(cp, &s);
    ASSERT_NO_FATAL_FAILURE(check(s));
    ASSERT_NO_FATAL_FAILURE(check(" " + s));
  }
  for (uint32_t first = 0; first <= 0x10FFFF; first += 64) {
    std::string s;
    for (uint32_t cp = first; cp < first + 64 && cp <= 0x10FFFF; ++cp) {
      if (cp >= 0xD800 && cp <= 0xDFFF) continue;
      AppendUtf8(cp, &s);
      if (cp % 7 == 0) s += ' ';
    }
    for (bool special : {false, true}) {
      ASSERT_LE((*t)->Encode(s, special).size(), s.size())
          << name << ": code points from U+" << std::hex << first;
    }
  }
}

TEST(AtMostATokenAByteTest, LlamaBpe) { CheckAtMostATokenAByte("llama-bpe"); }
TEST(AtMostATokenAByteTest, Gpt2) { CheckAtMostATokenAByte("gpt-2"); }
TEST(AtMostATokenAByteTest, StarCoder) { CheckAtMostATokenAByte("starcoder"); }

}  // namespace
}  // namespace lazyattn
