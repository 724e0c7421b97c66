#include "common/request_validator.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <initializer_list>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/utf8.h"

namespace lazyattn {
namespace {

using lazyattn::v1::GenerateRequest;
using lazyattn::v1::PrefetchRequest;
using ::testing::HasSubstr;
using ::testing::HasSubstr;

GenerateRequest Valid() {
  GenerateRequest r;
  r.add_documents()->set_text("a document");
  r.add_documents()->mutable_tokens()->add_ids(5);
  r.set_question("why?");
  r.mutable_sampling()->set_temperature(0.7f);
  r.mutable_sampling()->set_top_p(0.9f);
  r.mutable_sampling()->set_max_tokens(64);
  r.mutable_sampling()->add_stop("\n\n");
  r.set_cache_mode(lazyattn::v1::CACHE_MODE_LAZY);
  return r;
}

std::string Error(const GenerateRequest& r, int64_t vocab = 1000) {
  ApiLimits limits;
  limits.max_documents = 3;
  limits.max_document_bytes = 16;
  limits.max_document_tokens = 4;
  limits.max_stop_strings = 2;
  limits.max_stop_bytes = 4;
  limits.max_stop_token_ids = 2;
  limits.max_logit_bias = 2;
  limits.max_system_bytes = 8;
  limits.max_question_bytes = 8;
  limits.max_tokens = 100;
  absl::Status s = ValidateGenerateRequest(r, limits, vocab);
  if (s.ok()) return "ok";
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  return std::string(s.message());
}

TEST(RequestValidatorTest, AcceptsAValidRequest) {
  EXPECT_EQ(Error(Valid()), "ok");
  GenerateRequest no_docs;
  no_docs.set_question("hi");
  EXPECT_EQ(Error(no_docs), "ok");
  GenerateRequest docs_and_question;
  docs_and_question.add_documents()->set_text("x");
  docs_and_question.set_question("?");
  EXPECT_EQ(Error(docs_and_question), "ok");
}

GenerateRequest Conversation(std::initializer_list<std::pair<const char*, const char*>> turns) {
  GenerateRequest r;
  for (const auto& [role, content] : turns) {
    v1::ChatMessage* m = r.add_messages();
    m->set_role(role);
    m->set_content(content);
  }
  return r;
}

TEST(RequestValidatorTest, MultiTurnConversations) {
  EXPECT_EQ(Error(Conversation({{"system", "s"}, {"user", "a"}, {"assistant", "b"}, {"user", "c"}})),
            "ok");
  GenerateRequest with_docs = Conversation({{"user", ""}});
  with_docs.add_documents()->set_text("doc");
  EXPECT_EQ(Error(with_docs), "ok");
  EXPECT_EQ(Error(Conversation({{"user", "a"}, {"system", "s"}, {"user", "c"}})),
            "messages[1].role: a system message must be the first message");
  EXPECT_EQ(Error(Conversation({{"tool", "a"}, {"user", "c"}})),
            "messages[0].role: expected system, user or assistant");
  EXPECT_EQ(Error(Conversation({{"user", "a"}, {"assistant", "b"}})),
            "messages[1].role: the last message must be a user turn (generation answers it)");
  EXPECT_EQ(Error(Conversation({{"user", "123456789"}})),
            "messages[0].content: 9 bytes, the limit is 8");
  EXPECT_THAT(Error(Conversation({{"user", "\xff"}})),
              HasSubstr("messages[0].content: not valid UTF-8"));
  GenerateRequest question = Conversation({{"user", "a"}});
  question.set_question("q");
  EXPECT_THAT(Error(question), HasSubstr("question: must be empty with messages"));
  GenerateRequest system = Conversation({{"user", "a"}});
  system.set_system("s");
  EXPECT_THAT(Error(system), HasSubstr("system: must be empty with messages"));
  GenerateRequest many;
  for (int i = 0; i < 257; ++i) *many.add_messages() = Conversation({{"user", "a"}}).messages(0);
  EXPECT_EQ(Error(many), "messages: 257 messages, the limit is 256");
}

TEST(RequestValidatorTest, NamesTheBadField) {
  auto with = [](auto edit) {
    GenerateRequest r = Valid();
    edit(r);
    return Error(r);
  };
  EXPECT_EQ(with([](GenerateRequest& r) { r.add_documents()->set_text(""); }),
            "documents[2].text: empty document");
  EXPECT_EQ(with([](GenerateRequest& r) {
              for (int i = 0; i < 2; ++i) r.add_documents()->set_text("x");
            }),
            "documents: 4 documents, the limit is 3");
  EXPECT_EQ(
      with([](GenerateRequest& r) { r.mutable_documents(0)->set_text(std::string(17, 'x')); }),
      "documents[0].text: 17 bytes, the limit is 16");
  EXPECT_EQ(with([](GenerateRequest& r) { r.mutable_documents(1)->mutable_tokens()->clear_ids(); }),
            "documents[1].tokens: empty document");
  EXPECT_EQ(with([](GenerateRequest& r) {
              for (int i = 0; i < 4; ++i) r.mutable_documents(1)->mutable_tokens()->add_ids(1);
            }),
            "documents[1].tokens: 5 tokens, the limit is 4");
  EXPECT_EQ(with([](GenerateRequest& r) { r.mutable_documents(1)->mutable_tokens()->add_ids(-3); }),
            "documents[1].tokens.ids[1]: negative token id -3");
  EXPECT_THAT(
      with([](GenerateRequest& r) { r.mutable_documents(1)->mutable_tokens()->add_ids(1000); }),
      HasSubstr("documents[1].tokens.ids[1]: token id 1000 outside the vocabulary"));
  EXPECT_EQ(with([](GenerateRequest& r) { r.mutable_documents(0)->clear_text(); }),
            "documents[0]: neither text nor tokens set");
  // A cache salt is any bytes (NUL and invalid UTF-8 included), up to kMaxCacheSaltBytes.
  EXPECT_EQ(
      with([](GenerateRequest& r) { r.set_cache_salt(std::string(kMaxCacheSaltBytes, '\xff')); }),
      "ok");
  EXPECT_EQ(
      with([](GenerateRequest& r) { r.set_cache_salt(std::string(kMaxCacheSaltBytes + 1, 's')); }),
      "cache_salt: 1025 bytes, the limit is 1024");
  EXPECT_THAT(
      with([](GenerateRequest& r) { r.mutable_documents(0)->set_id(std::string(300, 'i')); }),
      HasSubstr("documents[0].id: 300 bytes"));
  EXPECT_EQ(with([](GenerateRequest& r) {
              r.clear_documents();
              r.clear_question();
            }),
            "question: must not be empty (generation starts after it)");
  // Documents do not stand in for it: the worker starts generation from the question.
  EXPECT_EQ(with([](GenerateRequest& r) { r.clear_question(); }),
            "question: must not be empty (generation starts after it)");
  EXPECT_THAT(with([](GenerateRequest& r) { r.set_question("123456789"); }),
              HasSubstr("question: 9 bytes"));
  EXPECT_THAT(with([](GenerateRequest& r) { r.set_system("123456789"); }),
              HasSubstr("system: 9 bytes"));
  EXPECT_THAT(with([](GenerateRequest& r) { r.mutable_sampling()->set_temperature(-0.5f); }),
              HasSubstr("sampling.temperature"));
  EXPECT_THAT(with([](GenerateRequest& r) { r.mutable_sampling()->set_temperature(NAN); }),
              HasSubstr("sampling.temperature"));
  // Denormal and tiny temperatures are valid: the samplers treat them as greedy.
  EXPECT_EQ(with([](GenerateRequest& r) { r.mutable_sampling()->set_temperature(1e-40f); }), "ok");
  EXPECT_EQ(with([](GenerateRequest& r) { r.mutable_sampling()->set_temperature(1e-45f); }), "ok");
  EXPECT_THAT(with([](GenerateRequest& r) { r.mutable_sampling()->set_top_k(-1); }),
              HasSubstr("sampling.top_k"));
  EXPECT_THAT(with([](GenerateRequest& r) { r.mutable_sampling()->set_top_p(1.5f); }),
              HasSubstr("sampling.top_p"));
  // A float just past a bound is quoted as the value it is, not rounded onto the bound.
  EXPECT_EQ(with([](GenerateRequest& r) { r.mutable_sampling()->set_top_p(1.0000001f); }),
            "sampling.top_p: 1.0000001 outside [0, 1]");
  EXPECT_EQ(with([](GenerateRequest& r) { r.mutable_sampling()->set_min_p(-1e-7f); }),
            "sampling.min_p: -1e-07 outside [0, 1]");
  EXPECT_EQ(with([](GenerateRequest& r) { r.mutable_sampling()->set_temperature(100.00001f); }),
            "sampling.temperature: 100.00001 outside [0, 100]");
  EXPECT_EQ(
      with([](GenerateRequest& r) { r.mutable_sampling()->set_presence_penalty(-2.0000002f); }),
      "sampling.presence_penalty: -2.0000002 outside [-2, 2]");
  EXPECT_EQ(with([](GenerateRequest& r) { r.mutable_sampling()->set_max_tokens(101); }),
            "sampling.max_tokens: 101 outside [0, 100]");
  EXPECT_THAT(with([](GenerateRequest& r) { r.mutable_sampling()->set_max_tokens(-1); }),
              HasSubstr("sampling.max_tokens"));
  EXPECT_EQ(with([](GenerateRequest& r) {
              r.mutable_sampling()->set_logprobs(true);
              r.mutable_sampling()->set_top_logprobs(20);
            }),
            "ok");
  EXPECT_EQ(with([](GenerateRequest& r) {
              r.mutable_sampling()->set_logprobs(true);
              r.mutable_sampling()->set_top_logprobs(21);
            }),
            "sampling.top_logprobs: 21 outside [0, 20]");
  EXPECT_THAT(with([](GenerateRequest& r) {
                r.mutable_sampling()->set_logprobs(true);
                r.mutable_sampling()->set_top_logprobs(-1);
              }),
              HasSubstr("sampling.top_logprobs: -1 outside"));
  EXPECT_THAT(with([](GenerateRequest& r) { r.mutable_sampling()->set_top_logprobs(3); }),
              HasSubstr("sampling.top_logprobs: 3 needs sampling.logprobs"));
  EXPECT_THAT(with([](GenerateRequest& r) {
                r.mutable_sampling()->add_stop("a");
                r.mutable_sampling()->add_stop("b");
              }),
              HasSubstr("sampling.stop: 3 stop strings, the limit is 2"));
  EXPECT_EQ(with([](GenerateRequest& r) { r.mutable_sampling()->add_stop(""); }),
            "sampling.stop[1]: empty stop string");
  EXPECT_THAT(with([](GenerateRequest& r) { r.mutable_sampling()->set_stop(0, "12345"); }),
              HasSubstr("sampling.stop[0]: 5 bytes"));
  EXPECT_THAT(with([](GenerateRequest& r) {
                for (int i = 0; i < 3; ++i) r.mutable_sampling()->add_stop_token_ids(1);
              }),
              HasSubstr("sampling.stop_token_ids: 3 ids"));
  EXPECT_THAT(with([](GenerateRequest& r) { r.mutable_sampling()->add_stop_token_ids(-2); }),
              HasSubstr("sampling.stop_token_ids[0]: negative token id -2"));
  EXPECT_EQ(
      with([](GenerateRequest& r) { r.set_cache_mode(static_cast<lazyattn::v1::CacheMode>(9)); }),
      "cache_mode: unknown cache mode 9");
}

TEST(RequestValidatorTest, LogitBias) {
  auto with = [](std::initializer_list<std::pair<int32_t, float>> entries, int64_t vocab = 1000) {
    GenerateRequest r = Valid();
    for (const auto& [id, bias] : entries) (*r.mutable_sampling()->mutable_logit_bias())[id] = bias;
    return Error(r, vocab);
  };
  EXPECT_EQ(with({{0, -100.0f}, {999, 100.0f}}), "ok");
  EXPECT_EQ(with({{1, 0.5f}, {2, 0.5f}, {3, 0.5f}}),
            "sampling.logit_bias: 3 entries, the limit is 2 (limits.max_logit_bias)");
  EXPECT_EQ(with({{1000, 1.0f}}),
            "sampling.logit_bias[1000]: token id 1000 outside the vocabulary (size 1000)");
  EXPECT_EQ(with({{1000, 1.0f}}, /*vocab=*/0), "ok");
  EXPECT_EQ(with({{-3, 1.0f}}), "sampling.logit_bias[-3]: negative token id -3");
  EXPECT_EQ(with({{7, 100.5f}}), "sampling.logit_bias[7]: bias 100.5 outside [-100, 100]");
  EXPECT_EQ(with({{7, 100.00001f}}), "sampling.logit_bias[7]: bias 100.00001 outside [-100, 100]");
  EXPECT_EQ(with({{7, -101.0f}}), "sampling.logit_bias[7]: bias -101 outside [-100, 100]");
  EXPECT_EQ(with({{7, std::nanf("")}}), "sampling.logit_bias[7]: bias nan outside [-100, 100]");
  EXPECT_EQ(with({{7, INFINITY}}), "sampling.logit_bias[7]: bias inf outside [-100, 100]");
  // Several bad entries: the lowest id is named, whatever the map's order.
  EXPECT_EQ(with({{9, 500.0f}, {4, 200.0f}}),
            "sampling.logit_bias[4]: bias 200 outside [-100, 100]");
}

TEST(RequestValidatorTest, UnknownVocabularySkipsTheUpperBound) {
  GenerateRequest r = Valid();
  r.mutable_documents(1)->mutable_tokens()->add_ids(123456);
  EXPECT_EQ(Error(r, /*vocab=*/0), "ok");
}

TEST(RequestValidatorTest, Prefetch) {
  ApiLimits limits;
  limits.max_prefetch_replicas = 4;
  PrefetchRequest r;
  EXPECT_THAT(ValidatePrefetchRequest(r, limits, 0).message(),
              HasSubstr("documents: no documents"));
  r.add_documents()->set_text("doc");
  EXPECT_TRUE(ValidatePrefetchRequest(r, limits, 0).ok());
  r.set_replicas(5);
  EXPECT_THAT(ValidatePrefetchRequest(r, limits, 0).message(), HasSubstr("replicas: 5 outside"));
  r.set_replicas(2);
  r.set_cache_mode(lazyattn::v1::CACHE_MODE_FULL);
  EXPECT_THAT(ValidatePrefetchRequest(r, limits, 0).message(),
              HasSubstr("cache_mode: prefetch takes LAZY or BLOCK, got CACHE_MODE_FULL"));
  r.set_cache_mode(lazyattn::v1::CACHE_MODE_BLOCK);
  r.set_cache_salt(std::string(kMaxCacheSaltBytes + 1, 's'));
  EXPECT_EQ(ValidatePrefetchRequest(r, limits, 0).message(),
            "cache_salt: 1025 bytes, the limit is 1024");
  r.clear_cache_salt();
  r.add_documents()->set_text("");
  EXPECT_EQ(ValidatePrefetchRequest(r, limits, 0).message(), "documents[1].text: empty document");
}


TEST(Utf8Test, FindsTheFirstBadByte) {
  EXPECT_TRUE(IsValidUtf8(""));
  EXPECT_TRUE(IsValidUtf8("caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80"));
  EXPECT_TRUE(IsValidUtf8(std::string("\0x", 2)));
  EXPECT_EQ(FirstInvalidUtf8Byte("ab\xFF"), 2u);
  EXPECT_EQ(FirstInvalidUtf8Byte("a\x80"), 1u);                 // stray continuation byte
  EXPECT_EQ(FirstInvalidUtf8Byte("ab\xE2\x82"), 2u);            // cut short
  EXPECT_EQ(FirstInvalidUtf8Byte("\xC0\xAF"), 0u);              // overlong
  EXPECT_EQ(FirstInvalidUtf8Byte("x\xED\xA0\x80"), 1u);         // surrogate
  EXPECT_EQ(FirstInvalidUtf8Byte("\xF4\x90\x80\x80"), 0u);      // above U+10FFFF
  EXPECT_EQ(FirstInvalidUtf8Byte("\xE2\x82\xAC\xE2\x28\xA1"), 3u);  // bad continuation
  EXPECT_EQ(ToValidUtf8("a\xFF" "b"), "a\xEF\xBF\xBD" "b");
}

// Every text field of both request messages: InvalidArgument naming the field (with its index),
// and the label a metric counts it under.
TEST(RequestValidatorTest, InvalidUtf8NamesEachTextField) {
  const std::string bad = "ok\xC3(";  // a lead byte followed by ASCII
  struct Case {
    std::function<void(GenerateRequest&)> edit;
    std::string field;
    std::string label;
  };
  const std::vector<Case> cases = {
      {[&](GenerateRequest& r) { r.set_system(bad); }, "system", "system"},
      {[&](GenerateRequest& r) { r.set_question(bad); }, "question", "question"},
      {[&](GenerateRequest& r) { r.mutable_documents(1)->set_id(bad); }, "documents[1].id",
       "documents.id"},
      {[&](GenerateRequest& r) { r.mutable_documents(0)->set_text(bad); }, "documents[0].text",
       "documents.text"},
      {[&](GenerateRequest& r) { r.mutable_sampling()->add_stop(bad); }, "sampling.stop[1]",
       "sampling.stop"},
  };
  for (const Case& c : cases) {
    GenerateRequest r = Valid();
    c.edit(r);
    const absl::Status s = ValidateGenerateRequest(r, ApiLimits{}, 1000);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_THAT(std::string(s.message()), ::testing::StartsWith(c.field + ": not valid UTF-8"));
    EXPECT_EQ(InvalidUtf8FieldLabel(s), c.label);
  }
  // Other rejections carry no label.
  GenerateRequest r = Valid();
  r.mutable_sampling()->set_top_k(-1);
  EXPECT_EQ(InvalidUtf8FieldLabel(ValidateGenerateRequest(r, ApiLimits{}, 1000)), std::nullopt);
  EXPECT_EQ(InvalidUtf8FieldLabel(absl::InvalidArgumentError("x")), std::nullopt);

  PrefetchRequest p;
  p.add_documents()->set_text("fine");
  p.add_documents()->set_text(bad);
  absl::Status s = ValidatePrefetchRequest(p, ApiLimits{}, 0);
  EXPECT_EQ(s.message(), "documents[1].text: not valid UTF-8 (byte 2 of 4, value 0xc3)");
  EXPECT_EQ(InvalidUtf8FieldLabel(s), "documents.text");
  p.mutable_documents(1)->set_text("fine");
  p.mutable_documents(0)->set_id("\x80");
  s = ValidatePrefetchRequest(p, ApiLimits{}, 0);
  EXPECT_THAT(std::string(s.message()), ::testing::StartsWith("documents[0].id: not valid UTF-8"));
  EXPECT_EQ(InvalidUtf8FieldLabel(s), "documents.id");
}

TEST(RequestValidatorTest, LimitsFromYaml) {
  YamlConfig config;
  ASSERT_TRUE(config
                  .LoadString("limits:\n  max_documents: 7\n  max_tokens: 99\n"
                              "  max_stop_strings: 3\n  max_stop_bytes: 5\n"
                              "  max_stop_token_ids: 4\n  max_document_id_bytes: 9\n"
                              "  max_document_bytes: 1000\n  max_document_tokens: 50\n"
                              "  max_system_bytes: 11\n  max_question_bytes: 12\n"
                              "  max_prefetch_replicas: 2\n  max_logit_bias: 17\n")
                  .ok());
  auto l = ApiLimitsFromYaml(config);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->max_documents, 7);
  EXPECT_EQ(l->max_tokens, 99);
  EXPECT_EQ(l->max_stop_strings, 3);
  EXPECT_EQ(l->max_stop_bytes, 5);
  EXPECT_EQ(l->max_stop_token_ids, 4);
  EXPECT_EQ(l->max_document_id_bytes, 9);
  EXPECT_EQ(l->max_document_bytes, 1000);
  EXPECT_EQ(l->max_document_tokens, 50);
  EXPECT_EQ(l->max_system_bytes, 11);
  EXPECT_EQ(l->max_question_bytes, 12);
  EXPECT_EQ(l->max_prefetch_replicas, 2);
  EXPECT_EQ(l->max_logit_bias, 17);
  EXPECT_TRUE(config.Finish().ok());

  YamlConfig bad;
  ASSERT_TRUE(bad.LoadString("limits:\n  max_tokens: 0\n", "w.yaml").ok());
  EXPECT_EQ(ApiLimitsFromYaml(bad).status().message(),
            "w.yaml: limits.max_tokens: must be in [1, 16777216], got 0");
  // The engine applies at most 16 stop strings: a limit above it would pass requests it refuses.
  YamlConfig many_stops;
  ASSERT_TRUE(many_stops.LoadString("limits:\n  max_stop_strings: 17\n", "w.yaml").ok());
  EXPECT_EQ(ApiLimitsFromYaml(many_stops).status().message(),
            "w.yaml: limits.max_stop_strings: must be in [0, 16], got 17");
}

}  // namespace
}  // namespace lazyattn
