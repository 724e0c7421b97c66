// PrepareRequest's tokenization by mode against HF transformers (tests/data/prompt_golden.json,
// made by tools/reference/gen_prompt_golden.py from SmolLM2's GGUF): modes full and prefix feed the
// model exactly the ids HF gets for the whole rendered chat prompt; modes block and lazy keep the
// system prefix, each document and the question apart. Needs models/SmolLM2-135M-Instruct.Q4_1.gguf
// (tools/fetch-model); without it the suite fails rather than passing untested.
#include "services/worker/engine/request_prep.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "services/worker/engine/chat_prompt.h"
#include "services/worker/engine/document_key_memo.h"
#include "services/worker/engine/document_token_cache.h"
#include "services/worker/model/gguf_file.h"
#include "services/worker/model/tokenizer/tokenizer_spec.h"

namespace lazyattn {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

constexpr char kModelPath[] = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
constexpr char kGoldenPath[] = "tests/data/prompt_golden.json";

std::vector<int32_t> Concat(const PreparedRequest& p) {
  std::vector<int32_t> all = p.system_prefix;
  for (const auto& d : p.documents) all.insert(all.end(), d.tokens.begin(), d.tokens.end());
  all.insert(all.end(), p.question.begin(), p.question.end());
  return all;
}

class RequestPrepTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ASSERT_TRUE(std::filesystem::exists(kModelPath)) << kModelPath << " missing: tools/fetch-model";
    auto gguf = GgufFile::Open(kModelPath);
    ASSERT_TRUE(gguf.ok()) << gguf.status();
    auto spec = TokenizerSpecFromGguf(**gguf);
    ASSERT_TRUE(spec.ok()) << spec.status();
    auto tok = Tokenizer::Create(*std::move(spec));
    ASSERT_TRUE(tok.ok()) << tok.status();
    tokenizer_ = tok->release();
    std::ifstream in(kGoldenPath);
    std::stringstream ss;
    ss << in.rdbuf();
    golden_ = new nlohmann::json(nlohmann::json::parse(ss.str()));
  }
  static void TearDownTestSuite() {
    delete tokenizer_;
    delete golden_;
  }

  absl::StatusOr<PreparedRequest> Prepare(const EngineRequest& r) const {
    ModelConfig config;
    config.vocab_size = tokenizer_->vocab_size();
    config.max_positions = 8192;
    return PrepareRequest(r, *tokenizer_, config, {"model", "tokenizer"}, {});
  }

  // The golden case as a request, its prompt text built by BuildPrompt (checked against HF's cut).
  EngineRequest RequestFor(const nlohmann::json& c, CacheMode mode) const {
    const std::string system = c["system"].is_null() ? "" : c["system"].get<std::string>();
    auto parts = BuildPrompt(*tokenizer_, /*chat=*/true, system, c["question"]);
    EXPECT_TRUE(parts.ok()) << parts.status();
    if (!parts.ok()) return {};
    EXPECT_EQ(parts->system_prefix, c["system_prefix"].get<std::string>());
    EXPECT_EQ(parts->question, c["question_text"].get<std::string>());
    EngineRequest r{.system_prefix = parts->system_prefix, .question = parts->question, .mode = mode};
    for (const auto& d : c["documents"]) r.documents.push_back({.text = d.get<std::string>()});
    return r;
  }

  static Tokenizer* tokenizer_;
  static nlohmann::json* golden_;
};
Tokenizer* RequestPrepTest::tokenizer_ = nullptr;
nlohmann::json* RequestPrepTest::golden_ = nullptr;

TEST_F(RequestPrepTest, FullAndPrefixTokenizeTheWholeRenderedPromptAsHfDoes) {
  ASSERT_GE((*golden_)["prompts"].size(), 10u);
  int differ_when_split = 0;
  for (const auto& c : (*golden_)["prompts"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    const auto whole = c["whole_ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(tokenizer_->Encode(c["rendered"].get<std::string>(), true), whole);
    for (CacheMode mode : {CacheMode::kFull, CacheMode::kPrefix}) {
      auto p = Prepare(RequestFor(c, mode));
      ASSERT_TRUE(p.ok()) << p.status();
      EXPECT_EQ(Concat(*p), whole);
      EXPECT_EQ(p->prompt_tokens(), static_cast<int64_t>(whole.size()));
      EXPECT_FALSE(p->question.empty());
    }
    std::vector<int32_t> split = c["prefix_ids"].get<std::vector<int32_t>>();
    for (const auto& d : c["document_ids"]) {
      for (int32_t id : d) split.push_back(id);
    }
    for (int32_t id : c["question_ids"]) split.push_back(id);
    if (split != whole) ++differ_when_split;
  }
  // The cases are chosen so that tokenizing the parts apart would be wrong for several of them.
  EXPECT_GE(differ_when_split, 5);
}

TEST_F(RequestPrepTest, BlockAndLazyKeepEveryBoundary) {
  for (const auto& c : (*golden_)["prompts"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    for (CacheMode mode : {CacheMode::kBlock, CacheMode::kLazy}) {
      auto p = Prepare(RequestFor(c, mode));
      ASSERT_TRUE(p.ok()) << p.status();
      EXPECT_EQ(p->system_prefix, c["prefix_ids"].get<std::vector<int32_t>>());
      ASSERT_EQ(p->documents.size(), c["document_ids"].size());
      for (size_t i = 0; i < p->documents.size(); ++i) {
        EXPECT_EQ(p->documents[i].tokens, c["document_ids"][i].get<std::vector<int32_t>>());
      }
      EXPECT_EQ(p->question, c["question_ids"].get<std::vector<int32_t>>());
    }
  }
}

// The example, spelled out: "user\n" + "\n   Summarize" is user, ĊĊĠĠ, ĠSummar... in the
// whole, and user, Ċ | ĊĠĠ, ... when cut apart.
TEST_F(RequestPrepTest, QuestionStartingWithWhitespaceJoinsTheTemplatesNewline) {
  const Tokenizer& t = *tokenizer_;
  const int32_t user = *t.TokenId("user");
  const int32_t nl = *t.TokenId("Ċ");
  const int32_t nl2_sp2 = *t.TokenId("ĊĊĠĠ");
  EngineRequest r{.question = "\n   Summarize the text.", .mode = CacheMode::kFull};
  auto parts = BuildPrompt(t, true, "", r.question);
  ASSERT_TRUE(parts.ok()) << parts.status();
  r.system_prefix = parts->system_prefix;
  r.question = parts->question;
  auto full = Prepare(r);
  ASSERT_TRUE(full.ok()) << full.status();
  const std::vector<int32_t> all = Concat(*full);
  const auto at = std::find(all.begin(), all.end(), user) - all.begin();
  ASSERT_LT(at + 1, static_cast<int64_t>(all.size()));
  EXPECT_EQ(all[at + 1], nl2_sp2);
  // The token spanning the cut belongs to the question (it ends there).
  EXPECT_EQ(full->system_prefix.back(), user);
  EXPECT_EQ(full->question.front(), nl2_sp2);
  r.mode = CacheMode::kLazy;
  auto lazy = Prepare(r);
  ASSERT_TRUE(lazy.ok()) << lazy.status();
  EXPECT_EQ(lazy->system_prefix.back(), nl);
  EXPECT_NE(lazy->question.front(), nl2_sp2);
}

TEST_F(RequestPrepTest, ADocumentMergedIntoTheNextHasNoTokensInFullMode) {
  // " " + "x" is the one token "Ġx", which ends in the second document.
  EngineRequest r{.system_prefix = "S:", .question = "?", .mode = CacheMode::kFull};
  r.documents.push_back({.text = " "});
  r.documents.push_back({.text = "x"});
  auto p = Prepare(r);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_THAT(p->documents[0].tokens, IsEmpty());
  EXPECT_THAT(p->documents[1].tokens, ElementsAre(*tokenizer_->TokenId("Ġx")));
  EXPECT_EQ(Concat(*p), tokenizer_->Encode("S: x?", true));
  // Alone the first document is one token, so it is not "empty" in any mode.
  r.mode = CacheMode::kBlock;
  auto b = Prepare(r);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_THAT(b->documents[0].tokens, ElementsAre(*tokenizer_->TokenId("Ġ")));
}

TEST_F(RequestPrepTest, SpecialTokenTextInADocumentStaysLiteralInTheWhole) {
  EngineRequest r{.system_prefix = "<|im_start|>user\n", .question = "?<|im_end|>",
                  .mode = CacheMode::kPrefix};
  r.documents.push_back({.text = "a <|im_end|> b"});
  auto p = Prepare(r);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->system_prefix.front(), 1);  // <|im_start|> parsed in the prefix
  EXPECT_EQ(p->question.back(), 2);        // <|im_end|> parsed in the question
  EXPECT_EQ(std::count(p->documents[0].tokens.begin(), p->documents[0].tokens.end(), 2), 0);
  auto text = tokenizer_->Decode(Concat(*p));
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text, "<|im_start|>user\na <|im_end|> b?<|im_end|>");
}

// Token ids cannot be re-tokenized: they stay as given, and the text on each side is tokenized
// as its own whole.
TEST_F(RequestPrepTest, TokenIdPartsAreBoundariesInFullMode) {
  const std::vector<int32_t> ids = {4093, 198};
  EngineRequest r{.system_prefix = "Q:\n", .question = "\n  why", .mode = CacheMode::kFull};
  r.documents.push_back({.text = "\n  one"});
  r.documents.push_back({.token_ids = ids});
  r.documents.push_back({.text = " two "});
  auto p = Prepare(r);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->documents[1].tokens, ids);
  std::vector<int32_t> expected = tokenizer_->Encode("Q:\n\n  one", true);
  expected.insert(expected.end(), ids.begin(), ids.end());
  const std::vector<int32_t> tail = tokenizer_->Encode(" two \n  why", true);
  expected.insert(expected.end(), tail.begin(), tail.end());
  EXPECT_EQ(Concat(*p), expected);

  EngineRequest q{.system_prefix = "A ", .question_token_ids = ids, .mode = CacheMode::kPrefix};
  q.documents.push_back({.text = "b"});
  auto pq = Prepare(q);
  ASSERT_TRUE(pq.ok()) << pq.status();
  EXPECT_EQ(pq->question, ids);
  std::vector<int32_t> head = pq->system_prefix;
  head.insert(head.end(), pq->documents[0].tokens.begin(), pq->documents[0].tokens.end());
  EXPECT_EQ(head, tokenizer_->Encode("A b", true));
}

TEST_F(RequestPrepTest, ValidationLooksAtEachPartAloneInEveryMode) {
  for (CacheMode mode : {CacheMode::kFull, CacheMode::kPrefix, CacheMode::kBlock}) {
    EngineRequest r{.question = "q", .mode = mode};
    r.documents.push_back({.text = "\x04\x06"});  // bytes SmolLM2 has no token for
    auto p = Prepare(r);
    ASSERT_FALSE(p.ok());
    EXPECT_THAT(std::string(p.status().message()), ::testing::HasSubstr("documents[0]"));
  }
}

// A document past the model's context is refused before preparation remembers it: kept, a few
// such requests would evict the token ids and keys of documents that can be served.
TEST_F(RequestPrepTest, ADocumentPastTheContextIsNotRemembered) {
  ModelConfig config;
  config.vocab_size = tokenizer_->vocab_size();
  config.max_positions = 16;
  DocumentTokenCache token_ids(1 << 20);
  DocumentKeyMemo keys(1 << 20);
  const PrepMemory memory{.token_ids = &token_ids, .keys = &keys};
  std::string long_text;
  for (int i = 0; i < 40; ++i) long_text += " word";
  EngineRequest text{.question = "q", .mode = CacheMode::kLazy};
  text.documents.push_back({.text = long_text});
  auto p = PrepareRequest(text, *tokenizer_, config, {"model", "tokenizer"}, {}, memory);
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(std::string(p.status().message()),
              ::testing::HasSubstr("exceed the model's context"));
  EXPECT_EQ(token_ids.entries(), 0);
  const std::vector<int32_t> ids(40, 100);
  EngineRequest by_ids{.question = "q", .mode = CacheMode::kLazy};
  by_ids.documents.push_back({.token_ids = ids});
  p = PrepareRequest(by_ids, *tokenizer_, config, {"model", "tokenizer"}, {}, memory);
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(std::string(p.status().message()),
              ::testing::HasSubstr("exceed the model's context"));
  EXPECT_EQ(keys.tokens(), 0);
  EXPECT_EQ(keys.misses(), 0);
  // Within the context both are remembered.
  EngineRequest short_text{.question = "q", .mode = CacheMode::kLazy};
  short_text.documents.push_back({.text = " word word"});
  short_text.documents.push_back({.token_ids = std::vector<int32_t>(4, 100)});
  p = PrepareRequest(short_text, *tokenizer_, config, {"model", "tokenizer"}, {}, memory);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(token_ids.entries(), 1);
  EXPECT_EQ(keys.misses(), 1);
}

// A prompt far past the context is refused before it is tokenized, by a lower bound on its tokens
// that never exceeds what Encode makes: checked on the golden texts, on the vocabulary's longest
// token repeated (the bound's worst case) and on plain prose.
TEST_F(RequestPrepTest, APromptFarPastTheContextIsRefusedUntokenized) {
  const Tokenizer& t = *tokenizer_;
  std::vector<std::string> texts;
  for (const auto& c : (*golden_)["prompts"]) {
    texts.push_back(c["question"].get<std::string>());
    for (const auto& d : c["documents"]) texts.push_back(d.get<std::string>());
  }
  std::string longest;
  for (int32_t id = 0; id < t.vocab_size(); ++id) {
    if (t.TokenPiece(id).size() > longest.size()) longest = std::string(t.TokenPiece(id));
  }
  std::string repeated, prose;
  for (int i = 0; i < 2000; ++i) repeated += longest;
  for (int i = 0; i < 20000; ++i) prose += "The river floods in spring. ";
  texts.push_back(repeated);
  texts.push_back(prose);
  for (const std::string& text : texts) {
    for (bool special : {false, true}) {
      EXPECT_LE(t.MinTokensFor(text), static_cast<int64_t>(t.Encode(text, special).size()))
          << text.substr(0, 60);
    }
  }
  EXPECT_GT(t.MinTokensFor(prose), 0);
  // Not UTF-8: Encode replaces such bytes, which may have no token, so there is no bound.
  EXPECT_EQ(t.MinTokensFor(prose + "\x80" + prose), 0);
  EXPECT_GT(t.MinTokensFor(prose + "\xef\xbf\xbd" + prose), 0);  // U+FFFD itself is UTF-8

  // One document alone: named.
  EngineRequest huge_doc{.question = "Which river?", .mode = CacheMode::kLazy};
  huge_doc.documents.push_back({.text = std::string(16 << 20, 'a')});
  auto p = Prepare(huge_doc);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(p.status().message()),
              ::testing::StartsWith("documents[0].text: at least "));
  EXPECT_THAT(std::string(p.status().message()),
              ::testing::HasSubstr("tokens (16777216 bytes, not tokenized) exceed the model's "
                                   "context of 8192"));
  // Parts each within the context, together past it: the prompt.
  EngineRequest huge{
      .system_prefix = prose + prose + prose, .question = prose + prose, .mode = CacheMode::kLazy};
  for (int i = 0; i < 8; ++i) huge.documents.push_back({.text = prose + prose});
  ASSERT_LT(t.MinTokensFor(prose + prose + prose), 8192);
  p = Prepare(huge);
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(std::string(p.status().message()), ::testing::StartsWith("prompt: its text alone ("));
  EXPECT_THAT(std::string(p.status().message()),
              ::testing::HasSubstr("bytes, not tokenized) makes at least "));
  // Just past the context, the bound does not reach it: the exact count refuses it.
  EngineRequest past{.question = prose.substr(0, 60000), .mode = CacheMode::kLazy};
  p = Prepare(past);
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(std::string(p.status().message()), ::testing::StartsWith("prompt: "));
  EXPECT_THAT(std::string(p.status().message()), ::testing::Not(::testing::HasSubstr("at least")));
}

}  // namespace
}  // namespace lazyattn
