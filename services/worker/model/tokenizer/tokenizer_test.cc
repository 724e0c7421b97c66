#include "services/worker/model/tokenizer/tokenizer.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "services/worker/model/tokenizer/tokenizer_spec.h"

namespace lazyattn {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

// GPT-2's bytes_to_unicode() for one byte, as UTF-8.
std::string ByteChar(unsigned char b) {
  const bool direct = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
  uint32_t cp = b;
  if (!direct) {
    uint32_t n = 0;
    for (int x = 0; x < b; ++x) {
      const bool d = (x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE;
      if (!d) ++n;
    }
    cp = 256 + n;
  }
  std::string s;
  if (cp < 0x80) {
    s.push_back(static_cast<char>(cp));
  } else {
    s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
  return s;
}

// A tiny byte-level BPE vocabulary:
//   0 <|endoftext|> (control), 1 <|im_start|> (control), 2 <|im_end|> (control),
//   3 <tool> (user-defined), 4 <a> (control), 5 <a><b> (control),
//   6..261 the 256 byte characters, then the merge results.
TokenizerSpec TinySpec(std::string pre = "smollm") {
  TokenizerSpec spec;
  spec.model = "gpt2";
  spec.pre = std::move(pre);
  spec.source = "tiny";
  const auto add = [&](std::string text, TokenType type) {
    spec.tokens.push_back(std::move(text));
    spec.token_types.push_back(static_cast<int32_t>(type));
  };
  add("<|endoftext|>", TokenType::kControl);
  add("<|im_start|>", TokenType::kControl);
  add("<|im_end|>", TokenType::kControl);
  add("<tool>", TokenType::kUserDefined);
  add("<a>", TokenType::kControl);
  add("<a><b>", TokenType::kControl);
  for (int b = 0; b < 256; ++b) add(ByteChar(static_cast<unsigned char>(b)), TokenType::kNormal);
  const std::vector<std::pair<std::string, std::string>> merges =
      {
          {"h", "e"}, {"l", "l"},   {"he", "ll"}, {"hell", "o"},  {"Ġ", "w"},
          {"o", "r"}, {"Ġw", "or"}, {"l", "d"},   {"Ġwor", "ld"}, {"b", "c"},
          {"a", "b"}, {"a", "a"},   {"x", "y"},    // "xy" is not a token
          {"ð", "Ł"}, {"¦", "Ļ"},   {"ðŁ", "¦Ļ"},  // 🦙 = F0 9F A6 99 -> "ðŁ¦Ļ"
      };
  for (const auto& [l, r] : merges) {
    spec.merges.push_back({l, r});
    const std::string joined = l + r;
    if (joined != "xy") add(joined, TokenType::kNormal);
  }
  add("Ġhello", TokenType::kNormal);  // reachable only through ignore_merges (llama-bpe)
  spec.bos_id = 0;
  spec.eos_id = 0;
  return spec;
}

std::unique_ptr<Tokenizer> MakeTiny(std::string pre = "smollm") {
  absl::StatusOr<std::unique_ptr<Tokenizer>> t = Tokenizer::Create(TinySpec(std::move(pre)));
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? std::move(*t) : nullptr;
}

int32_t Id(const Tokenizer& t, const std::string& token) {
  std::optional<int32_t> id = t.TokenId(token);
  EXPECT_TRUE(id.has_value()) << token;
  return id.value_or(-1);
}

std::string Decode(const Tokenizer& t, const std::vector<int32_t>& ids) {
  absl::StatusOr<std::string> s = t.Decode(ids);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.value_or("");
}

TEST(TokenizerTest, MergesByRank) {
  auto t = MakeTiny();
  EXPECT_THAT(t->Encode("hello world", false), ElementsAre(Id(*t, "hello"), Id(*t, "Ġworld")));
  // ("b","c") ranks before ("a","b").
  EXPECT_THAT(t->Encode("abc", false), ElementsAre(Id(*t, "a"), Id(*t, "bc")));
  EXPECT_THAT(t->Encode("ab", false), ElementsAre(Id(*t, "ab")));
  // Equal ranks: leftmost first.
  EXPECT_THAT(t->Encode("aaa", false), ElementsAre(Id(*t, "aa"), Id(*t, "a")));
  EXPECT_THAT(t->Encode("aaaa", false), ElementsAre(Id(*t, "aa"), Id(*t, "aa")));
}

TEST(TokenizerTest, MergeResultOutsideVocabularyFallsBackLikeLlamaCpp) {
  auto t = MakeTiny();
  // "x"+"y" merges to "xy", which is not a token; llama.cpp then emits its bytes one by one.
  EXPECT_THAT(t->Encode("xy", false), ElementsAre(Id(*t, "x"), Id(*t, "y")));
}

TEST(TokenizerTest, IgnoreMergesForLlamaBpe) {
  auto smol = MakeTiny("smollm");
  auto llama = MakeTiny("llama-bpe");
  EXPECT_THAT(smol->Encode(" hello", false), ElementsAre(Id(*smol, "Ġ"), Id(*smol, "hello")));
  EXPECT_THAT(llama->Encode(" hello", false), ElementsAre(Id(*llama, "Ġhello")));
}

TEST(TokenizerTest, SpecialTokens) {
  auto t = MakeTiny();
  const std::string text = "<|im_start|>hello<tool><|im_end|>";
  EXPECT_THAT(t->Encode(text, /*parse_special=*/true), ElementsAre(1, Id(*t, "hello"), 3, 2));
  // Literal: control tokens are plain text, user-defined ones are still split out.
  std::vector<int32_t> plain = t->Encode(text, /*parse_special=*/false);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 1), 0);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 3), 1);
  EXPECT_EQ(Decode(*t, plain), text);
  EXPECT_EQ(Decode(*t, t->Encode(text, true)), text);
}

TEST(TokenizerTest, LongestSpecialTokenWins) {
  auto t = MakeTiny();
  EXPECT_THAT(t->Encode("<a><b><a>", true), ElementsAre(5, 4));
  EXPECT_THAT(t->Encode("<a><a><b>", true), ElementsAre(4, 5));
}

TEST(TokenizerTest, RoundTrip) {
  auto t = MakeTiny();
  const std::vector<std::string> texts = {
      "",
      "hello world",
      "  leading and trailing  ",
      "tabs\tand\nnewlines\r\n\r\n",
      "I'm can't 12345 3.14",
      "你好世界，这是一个测试。",
      "🦙🦙 llamas 👨‍👩‍👧",
      "café naïve Ångström e\u0301",
      std::string("nul\0byte", 8),
      "<|im_start|>user\nhi<|im_end|>",
      "\x7f\x01\x1b[31m ansi",
  };
  for (const std::string& s : texts) {
    EXPECT_EQ(Decode(*t, t->Encode(s, false)), s);
    EXPECT_EQ(Decode(*t, t->Encode(s, true)), s);
  }
}

TEST(TokenizerTest, InvalidUtf8IsTokenizedAsReplacementCharacters) {
  auto t = MakeTiny();
  const std::string bad =
      "ok\xff\xc3 \x80"
      "end\xe2\x82";
  std::vector<int32_t> ids = t->Encode(bad, false);
  EXPECT_EQ(Decode(*t, ids),
            "ok\xEF\xBF\xBD\xEF\xBF\xBD \xEF\xBF\xBD"
            "end\xEF\xBF\xBD\xEF\xBF\xBD");
}

TEST(TokenizerTest, EncodeWithSpecialsAddsBosOnce) {
  TokenizerSpec spec = TinySpec();
  spec.add_bos = true;
  auto t = std::move(*Tokenizer::Create(spec));
  EXPECT_THAT(t->EncodeWithSpecials("hello", false), ElementsAre(0, Id(*t, "hello")));
  EXPECT_THAT(t->EncodeWithSpecials("<|endoftext|>hello", true), ElementsAre(0, Id(*t, "hello")));
  EXPECT_THAT(t->EncodeWithSpecials("", false), ElementsAre(0));
  EXPECT_THAT(t->Encode("hello", false), ElementsAre(Id(*t, "hello")));
}

TEST(TokenizerTest, DecodeOptionsAndErrors) {
  auto t = MakeTiny();
  EXPECT_EQ(*t->Decode({1, Id(*t, "hello"), 3, 2}, /*render_special=*/false), "hello<tool>");
  absl::StatusOr<std::string> bad = t->Decode({Id(*t, "hello"), 99999});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(t->Decode({-1}).ok());
  EXPECT_EQ(t->TokenPiece(-5), "");
  EXPECT_EQ(t->TokenPiece(Id(*t, "Ġworld")), " world");
  EXPECT_EQ(t->token_type(3), TokenType::kUserDefined);
}

TEST(TokenizerTest, EndOfGenerationByName) {
  auto t = MakeTiny();
  EXPECT_TRUE(t->IsEndOfGeneration(0));  // <|endoftext|> (also eos)
  EXPECT_TRUE(t->IsEndOfGeneration(2));  // <|im_end|>
  EXPECT_FALSE(t->IsEndOfGeneration(1));
  EXPECT_EQ(t->eot_id(), 2);  // <|im_end|> is found before <|endoftext|>
}

TEST(TokenizerTest, CreateRejectsBadSpecs) {
  TokenizerSpec spm = TinySpec();
  spm.model = "llama";
  absl::StatusOr<std::unique_ptr<Tokenizer>> r = Tokenizer::Create(spm);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("\"llama\""));

  TokenizerSpec pre = TinySpec("qwen2");
  r = Tokenizer::Create(pre);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("qwen2"));

  TokenizerSpec dup = TinySpec();
  dup.tokens.push_back("hello");
  dup.token_types.push_back(1);
  r = Tokenizer::Create(dup);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("duplicate"));

  TokenizerSpec no_bos = TinySpec();
  no_bos.bos_id = -1;
  no_bos.add_bos = true;
  EXPECT_FALSE(Tokenizer::Create(no_bos).ok());

  TokenizerSpec short_types = TinySpec();
  short_types.token_types.resize(3);
  EXPECT_FALSE(Tokenizer::Create(short_types).ok());

  TokenizerSpec empty;
  empty.pre = "smollm";
  EXPECT_FALSE(Tokenizer::Create(empty).ok());
}

TEST(StreamingDecoderTest, HoldsBackSplitCharacters) {
  auto t = MakeTiny();
  // 🦙 byte by byte.
  const std::vector<int32_t> bytes = {Id(*t, "ð"), Id(*t, "Ł"), Id(*t, "¦"), Id(*t, "Ļ")};
  StreamingDecoder dec(t.get());
  EXPECT_EQ(*dec.Push(Id(*t, "hello")), "hello");
  EXPECT_EQ(*dec.Push(bytes[0]), "");
  EXPECT_EQ(*dec.Push(bytes[1]), "");
  EXPECT_EQ(*dec.Push(bytes[2]), "");
  EXPECT_EQ(dec.pending_bytes(), 3u);
  EXPECT_EQ(*dec.Push(bytes[3]), "\xF0\x9F\xA6\x99");
  EXPECT_EQ(dec.pending_bytes(), 0u);
  // Split into two tokens of two bytes, with text after the completing token.
  EXPECT_EQ(*dec.Push(Id(*t, "ðŁ")), "");
  EXPECT_EQ(*dec.Push(Id(*t, "¦Ļ")), "\xF0\x9F\xA6\x99");
  // The encoder keeps the emoji whole: one token.
  EXPECT_THAT(t->Encode("\xF0\x9F\xA6\x99", false), ElementsAre(Id(*t, "ðŁ¦Ļ")));
  // A stream that ends mid-character returns the rest on Flush().
  EXPECT_EQ(*dec.Push(bytes[0]), "");
  EXPECT_EQ(dec.Flush(), "\xF0");
  EXPECT_EQ(dec.Flush(), "");
}

TEST(StreamingDecoderTest, ConcatenationEqualsDecode) {
  auto t = MakeTiny();
  const std::string text = "héllo 🦙 wörld 你好 <|im_end|> end";
  const std::vector<int32_t> ids = t->Encode(text, true);
  StreamingDecoder dec(t.get());
  std::string streamed;
  for (int32_t id : ids) {
    absl::StatusOr<std::string> piece = dec.Push(id);
    ASSERT_TRUE(piece.ok());
    // Every chunk is complete UTF-8 on its own.
    for (size_t i = 0; i < piece->size();) {
      const unsigned char b = static_cast<unsigned char>((*piece)[i]);
      const size_t len = b < 0x80 ? 1 : b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : 2;
      ASSERT_LE(i + len, piece->size());
      i += len;
    }
    streamed += *piece;
  }
  streamed += dec.Flush();
  EXPECT_EQ(streamed, text);
}

TEST(StreamingDecoderTest, OptionsAndErrors) {
  auto t = MakeTiny();
  StreamingDecoder::Options options;
  options.render_special = false;
  options.replace_invalid = true;
  StreamingDecoder dec(t.get(), options);
  EXPECT_EQ(*dec.Push(1), "");                                   // control token hidden
  EXPECT_EQ(*dec.Push(Id(*t, ByteChar(0xFF))), "\xEF\xBF\xBD");  // never-valid byte
  EXPECT_FALSE(dec.Push(123456).ok());
  EXPECT_EQ(*dec.Push(Id(*t, "hello")), "hello");
}

// --- tokenizer.json -------------------------------------------------------------------------

class TokenizerJsonTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ("tokjson_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Write(const std::string& name, const std::string& content) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << content;
    return path;
  }

  // A tokenizer.json equivalent to TinySpec(): byte alphabet + merges, SmolLM2 pre-tokenizer.
  static nlohmann::json TinyJson(bool pair_merges) {
    TokenizerSpec spec = TinySpec();
    nlohmann::json vocab = nlohmann::json::object();
    nlohmann::json added = nlohmann::json::array();
    for (size_t i = 0; i < spec.tokens.size(); ++i) {
      vocab[spec.tokens[i]] = i;
      if (spec.token_types[i] != static_cast<int32_t>(TokenType::kNormal)) {
        added.push_back({{"id", i},
                         {"content", spec.tokens[i]},
                         {"special", spec.token_types[i] == 3},
                         {"normalized", false}});
      }
    }
    nlohmann::json merges = nlohmann::json::array();
    for (const auto& [l, r] : spec.merges) {
      if (pair_merges) {
        merges.push_back({l, r});
      } else {
        merges.push_back(l + " " + r);
      }
    }
    nlohmann::json j = nlohmann::json::parse(R"({
      "version": "1.0",
      "normalizer": null,
      "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": true},
        {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}]},
      "decoder": {"type": "ByteLevel"},
      "model": {"type": "BPE", "dropout": null, "unk_token": null,
                "continuing_subword_prefix": null, "end_of_word_suffix": null, "fuse_unk": false,
                "byte_fallback": false, "ignore_merges": false}
    })");
    j["added_tokens"] = added;
    j["model"]["vocab"] = vocab;
    j["model"]["merges"] = merges;
    return j;
  }

  std::filesystem::path dir_;
};

TEST_F(TokenizerJsonTest, LoadsBothMergeFormatsAndConfig) {
  for (bool pairs : {false, true}) {
    const std::string path = Write("tokenizer.json", TinyJson(pairs).dump());
    Write("tokenizer_config.json", R"({"bos_token": "<|im_start|>",
        "eos_token": {"content": "<|im_end|>", "special": true}, "add_bos_token": false,
        "chat_template": "{% for message in messages %}<|im_start|>...{% endfor %}"})");
    absl::StatusOr<TokenizerSpec> spec = TokenizerSpecFromTokenizerJson(path);
    ASSERT_TRUE(spec.ok()) << spec.status();
    EXPECT_EQ(spec->pre, "smollm");
    EXPECT_EQ(spec->bos_id, 1);
    EXPECT_EQ(spec->eos_id, 2);
    EXPECT_FALSE(spec->add_bos);
    EXPECT_THAT(spec->chat_template, HasSubstr("<|im_start|>"));
    EXPECT_EQ(spec->merges, TinySpec().merges);
    EXPECT_EQ(spec->token_types[1], static_cast<int32_t>(TokenType::kControl));
    EXPECT_EQ(spec->token_types[3], static_cast<int32_t>(TokenType::kUserDefined));
    auto t = Tokenizer::Create(*spec);
    ASSERT_TRUE(t.ok()) << t.status();
    auto reference = MakeTiny();
    const std::string text = "<|im_start|>hello world abc<tool>aaa 🦙";
    EXPECT_EQ((*t)->Encode(text, true), reference->Encode(text, true));
  }
}

TEST_F(TokenizerJsonTest, DetectsLlama3AndGpt2PreTokenizers) {
  nlohmann::json j = TinyJson(false);
  j["pre_tokenizer"] = nlohmann::json::parse(R"({"type": "Sequence", "pretokenizers": [
      {"type": "Split", "pattern": {"Regex": ""}, "behavior": "Isolated", "invert": false},
      {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true,
       "use_regex": false}]})");
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] =
      "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
      "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
  j["model"]["ignore_merges"] = true;
  j["post_processor"] = nlohmann::json::parse(R"({"type": "Sequence", "processors": [
      {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true},
      {"type": "TemplateProcessing", "single": [
        {"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}},
        {"Sequence": {"id": "A", "type_id": 0}}]}]})");
  absl::StatusOr<TokenizerSpec> spec =
      TokenizerSpecFromTokenizerJson(Write("tokenizer.json", j.dump()));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->pre, "llama-bpe");
  EXPECT_TRUE(spec->add_bos);
  EXPECT_EQ(spec->bos_id, 0);

  j = TinyJson(false);
  j["pre_tokenizer"] = nlohmann::json::parse(
      R"({"type": "ByteLevel", "add_prefix_space": false, "use_regex": true})");
  spec = TokenizerSpecFromTokenizerJson(Write("tokenizer.json", j.dump()));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->pre, "gpt2");
}

TEST_F(TokenizerJsonTest, Errors) {
  EXPECT_EQ(TokenizerSpecFromTokenizerJson((dir_ / "missing.json").string()).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(TokenizerSpecFromTokenizerJson(Write("bad.json", "{not json")).status().code(),
            absl::StatusCode::kInvalidArgument);

  nlohmann::json j = TinyJson(false);
  j["model"]["type"] = "WordPiece";
  absl::Status s = TokenizerSpecFromTokenizerJson(Write("tokenizer.json", j.dump())).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(s.message()), HasSubstr("WordPiece"));

  j = TinyJson(false);
  j["pre_tokenizer"] = nlohmann::json::parse(R"({"type": "Metaspace", "replacement": "_"})");
  s = TokenizerSpecFromTokenizerJson(Write("tokenizer.json", j.dump())).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(s.message()), HasSubstr("Metaspace"));

  j = TinyJson(false);
  j["model"]["vocab"]["hello"] = "not a number";
  s = TokenizerSpecFromTokenizerJson(Write("tokenizer.json", j.dump())).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
}

// The message of loading `j` as tokenizer.json (with `config` as tokenizer_config.json when it is
// not empty); "" when it loads.
class TokenizerJsonErrorTest : public TokenizerJsonTest {
 protected:
  std::string ErrorOf(const nlohmann::json& j, const std::string& config = "") {
    const std::string path = Write("tokenizer.json", j.dump());
    if (!config.empty()) Write("tokenizer_config.json", config);
    absl::Status s = TokenizerSpecFromTokenizerJson(path).status();
    if (s.ok()) return "";
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    return std::string(s.message());
  }
};

TEST_F(TokenizerJsonErrorTest, ConfigErrorsNameTheConfigFileAndTheKey) {
  const nlohmann::json j = TinyJson(false);
  std::string m = ErrorOf(j, R"({"add_bos_token": "true"})");
  EXPECT_THAT(m, HasSubstr("tokenizer_config.json: add_bos_token: expected a boolean, got a "
                           "string (\"true\")"));
  EXPECT_THAT(m, Not(HasSubstr("tokenizer.json")));
  EXPECT_THAT(ErrorOf(j, R"({"add_eos_token": 1})"),
              HasSubstr("tokenizer_config.json: add_eos_token: expected a boolean, got an "
                        "integer (1)"));
  EXPECT_THAT(ErrorOf(j, R"({"chat_template": [{"name": "default", "template": 5}]})"),
              HasSubstr("tokenizer_config.json: chat_template[0].template: expected a string, "
                        "got an integer (5)"));
  EXPECT_THAT(ErrorOf(j, R"({"chat_template": [{"name": "x", "template": "a"}, {"name": 1}]})"),
              HasSubstr("tokenizer_config.json: chat_template[1].name: expected a string"));
  EXPECT_THAT(ErrorOf(j, R"({"chat_template": [{"name": "default"}]})"),
              HasSubstr("tokenizer_config.json: chat_template[0].template: missing"));
  EXPECT_THAT(ErrorOf(j, R"({"chat_template": 5})"),
              HasSubstr("tokenizer_config.json: chat_template: expected a string or an array"));
  EXPECT_THAT(ErrorOf(j, R"({"eos_token": {"x": 1}})"),
              HasSubstr("tokenizer_config.json: eos_token.content: missing"));
  EXPECT_THAT(ErrorOf(j, R"({"bos_token": 3})"),
              HasSubstr("tokenizer_config.json: bos_token: expected a string or an object"));

  // The good forms still load: null is "not set", a template list picks "default".
  EXPECT_EQ(ErrorOf(j, R"({"add_bos_token": null, "eos_token": null, "chat_template": null})"), "");
  Write("tokenizer_config.json", R"({"add_bos_token": true, "chat_template": [
      {"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]})");
  absl::StatusOr<TokenizerSpec> spec =
      TokenizerSpecFromTokenizerJson(Write("tokenizer.json", j.dump()));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_TRUE(spec->add_bos);
  EXPECT_EQ(spec->chat_template, "D");
}

TEST_F(TokenizerJsonErrorTest, TokenizerJsonErrorsNameTheKeyPath) {
  nlohmann::json j = TinyJson(false);
  j["added_tokens"][3]["special"] = "yes";
  EXPECT_THAT(ErrorOf(j), HasSubstr("tokenizer.json: added_tokens[3].special: expected a "
                                    "boolean, got a string (\"yes\")"));

  j = TinyJson(false);
  j["added_tokens"][0].erase("content");
  EXPECT_THAT(ErrorOf(j), HasSubstr("tokenizer.json: added_tokens[0].content: missing"));

  j = TinyJson(false);
  j["added_tokens"][1]["id"] = "1";
  EXPECT_THAT(ErrorOf(j), HasSubstr("tokenizer.json: added_tokens[1].id: expected an integer id"));

  j = TinyJson(false);
  j["added_tokens"] = {{"a", 1}};
  EXPECT_THAT(ErrorOf(j), HasSubstr("tokenizer.json: added_tokens: expected an array, got an "
                                    "object"));

  j = TinyJson(false);
  j["pre_tokenizer"]["pretokenizers"][1]["add_prefix_space"] = "no";
  EXPECT_THAT(ErrorOf(j), HasSubstr("tokenizer.json: pre_tokenizer.pretokenizers[1]."
                                    "add_prefix_space: expected a boolean, got a string"));

  j = TinyJson(false);
  j["pre_tokenizer"]["pretokenizers"][0]["individual_digits"] = 1;
  EXPECT_THAT(ErrorOf(j), HasSubstr("tokenizer.json: pre_tokenizer.pretokenizers[0]."
                                    "individual_digits: expected a boolean, got an integer (1)"));

  j = TinyJson(false);
  j["model"]["ignore_merges"] = "x";
  EXPECT_THAT(ErrorOf(j), HasSubstr("tokenizer.json: model.ignore_merges: expected a boolean"));

  j = TinyJson(false);
  j["post_processor"] = nlohmann::json::parse(
      R"({"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": 5}}]})");
  EXPECT_THAT(ErrorOf(j), HasSubstr("tokenizer.json: post_processor.single[0].SpecialToken.id: "
                                    "expected a string, got an integer (5)"));

  j["post_processor"] = nlohmann::json::parse(R"({"type": "Sequence", "processors": [
      {"type": "ByteLevel"},
      {"type": "TemplateProcessing", "single": [{"SpecialToken": "<|im_start|>"}]}]})");
  EXPECT_THAT(ErrorOf(j), HasSubstr("tokenizer.json: post_processor.processors[1].single[0]."
                                    "SpecialToken: expected an object, got a string"));

  j = TinyJson(false);
  j["model"]["vocab"]["hello"] = "1";
  EXPECT_THAT(ErrorOf(j), HasSubstr("tokenizer.json: model.vocab: \"hello\": expected an "
                                    "integer id in [0, 2097152), got a string (\"1\")"));
}

TEST_F(TokenizerJsonErrorTest, MergesAreRequired) {
  nlohmann::json j = TinyJson(false);
  j["model"].erase("merges");
  EXPECT_THAT(ErrorOf(j), HasSubstr("tokenizer.json: model.merges: missing"));
  j["model"]["merges"] = nullptr;
  EXPECT_THAT(ErrorOf(j), HasSubstr("tokenizer.json: model.merges: missing"));
  j["model"]["merges"] = {{"h", "e"}};
  EXPECT_THAT(ErrorOf(j), HasSubstr("tokenizer.json: model.merges: expected an array, got an "
                                    "object"));
  j["model"]["merges"] = nlohmann::json::array({"h e", 5});
  EXPECT_THAT(ErrorOf(j), HasSubstr("tokenizer.json: model.merges[1]: expected a merge"));
  j["model"]["merges"] = nlohmann::json::array({"h e", "he"});
  EXPECT_THAT(ErrorOf(j), HasSubstr("tokenizer.json: model.merges[1]: malformed merge \"he\""));
  // An empty list with tokens of several symbols ("he", "ll", ...) in model.vocab: they could
  // never be produced, so the merges were lost.
  j["model"]["merges"] = nlohmann::json::array();
  EXPECT_THAT(ErrorOf(j), HasSubstr("tokenizer.json: model.merges: empty, but model.vocab has "
                                    "tokens of several symbols"));
}

TEST_F(TokenizerJsonErrorTest, EmptyMergesLoadForASingleSymbolVocabulary) {
  nlohmann::json j = TinyJson(false);
  nlohmann::json vocab = nlohmann::json::object();
  for (auto it = j["model"]["vocab"].begin(); it != j["model"]["vocab"].end(); ++it) {
    if (it.value().get<int>() < 6 + 256) vocab[it.key()] = it.value();  // specials + bytes
  }
  j["model"]["vocab"] = vocab;
  j["model"]["merges"] = nlohmann::json::array();
  absl::StatusOr<TokenizerSpec> spec =
      TokenizerSpecFromTokenizerJson(Write("tokenizer.json", j.dump()));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_TRUE(spec->merges.empty());
  auto t = Tokenizer::Create(*spec);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->Encode("hello", false).size(), 5u);

  // A character-level vocabulary whose special tokens sit only in model.vocab (no added_tokens
  // entry): those are not merge products, so it loads too.
  j["model"]["vocab"]["<unk>"] = 6 + 256;
  j["model"]["vocab"]["[PAD]"] = 6 + 257;
  spec = TokenizerSpecFromTokenizerJson(Write("tokenizer.json", j.dump()));
  ASSERT_TRUE(spec.ok()) << spec.status();
  // A word-like token still needs merges.
  j["model"]["vocab"]["hello"] = 6 + 258;
  EXPECT_THAT(ErrorOf(j), HasSubstr("model.merges: empty"));
}

TEST_F(TokenizerJsonErrorTest, TwoTokensWithOneIdAreRefused) {
  nlohmann::json j = TinyJson(false);
  const int hello_id = j["model"]["vocab"]["hello"].get<int>();
  j["model"]["vocab"]["zzz"] = hello_id;
  EXPECT_THAT(ErrorOf(j), HasSubstr(absl::StrCat("tokenizer.json: model.vocab: \"hello\" and "
                                                 "\"zzz\" both have id ",
                                                 hello_id)));

  // An added token that takes the id of another model.vocab token.
  j = TinyJson(false);
  j["added_tokens"].push_back({{"id", hello_id}, {"content", "<new>"}, {"special", true}});
  EXPECT_THAT(ErrorOf(j), HasSubstr(absl::StrCat("tokenizer.json: added_tokens[6]: \"<new>\" and "
                                                 "\"hello\" (model.vocab) both have id ",
                                                 hello_id)));

  // Two added tokens with one id.
  j = TinyJson(false);
  j["added_tokens"].push_back({{"id", 9999}, {"content", "<p>"}});
  j["added_tokens"].push_back({{"id", 9999}, {"content", "<q>"}});
  EXPECT_THAT(ErrorOf(j), HasSubstr("tokenizer.json: added_tokens[7]: \"<q>\" and \"<p>\" "
                                    "(added_tokens[6]) both have id 9999"));

  // The same token in model.vocab and added_tokens (TinyJson has all its specials twice), or
  // twice in added_tokens, is one token.
  j = TinyJson(false);
  j["added_tokens"].push_back(j["added_tokens"][1]);
  EXPECT_EQ(ErrorOf(j), "");
}

}  // namespace
}  // namespace lazyattn
