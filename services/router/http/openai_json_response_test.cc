// lazyattn.v1 -> OpenAI JSON: the response objects and stream chunks as OpenAI SDKs parse them.
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "services/router/http/openai_json.h"
#include "services/router/http/openai_json_test_util.h"
#include "services/router/http/openai_models.h"
#include "services/router/http/openai_response_json.h"

namespace lazyattn::router {
namespace {

using nlohmann::json;
using testing::ErrorOf;

v1::Final SampleFinal() {
  v1::Final f;
  f.set_finish_reason("length");
  f.mutable_usage()->set_prompt_tokens(10);
  f.mutable_usage()->set_cached_tokens(6);
  f.mutable_usage()->set_computed_tokens(4);
  f.mutable_usage()->set_completion_tokens(3);
  f.mutable_usage()->set_documents(2);
  f.mutable_usage()->set_documents_hit(1);
  f.set_worker("worker-1");
  f.set_attempts(1);
  return f;
}

TEST(OpenAiJsonTest, ChatCompletionObject) {
  const ResponseMeta meta{ApiKind::kChat, "chatcmpl-1", 1700000000, "smol"};
  v1::Final final = SampleFinal();
  final.set_text("Hello");
  const ChoiceResult one{&final};
  const json j = json::parse(CompletionJson(meta, {&one, 1}));
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["id"], "chatcmpl-1");
  EXPECT_EQ(j["created"], 1700000000);
  EXPECT_EQ(j["model"], "smol");
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(j["choices"][0]["message"]["content"], "Hello");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["prompt_tokens"], 10);
  EXPECT_EQ(j["usage"]["completion_tokens"], 3);
  EXPECT_EQ(j["usage"]["total_tokens"], 13);
  EXPECT_EQ(j["usage"]["prompt_tokens_details"]["cached_tokens"], 6);
  EXPECT_EQ(j["lazyattn"]["documents_hit"], 1);
  EXPECT_EQ(j["lazyattn"]["worker"], "worker-1");
  EXPECT_FALSE(j["choices"][0].contains("lazyattn"));  // one choice: the top level's only
}

// Logprobs built by make_logprobs as the response is written read exactly as ones given: the
// same bytes, each choice's built once.
TEST(OpenAiJsonTest, LogprobsBuiltWhileWritingAreTheSameBytesAsGivenOnes) {
  for (const ApiKind kind : {ApiKind::kChat, ApiKind::kCompletion}) {
    const ResponseMeta meta{kind, "id-1", 1, "smol"};
    std::vector<v1::Final> finals(2, SampleFinal());
    finals[1].set_text("other");
    const json lp0 = {{"content", json::array({{{"token", "a"}, {"logprob", -0.5}}})}};
    const json lp1 = {{"tokens", json::array({"b", "c"})}, {"text_offset", {0, 1}}};
    const std::vector<ChoiceResult> given = {{&finals[0], &lp0}, {&finals[1], &lp1}};
    int built = 0;
    const std::vector<ChoiceResult> lazy = {{&finals[0], nullptr,
                                             [&] {
                                               ++built;
                                               return lp0;
                                             }},
                                            {&finals[1], nullptr, [&] {
                                               ++built;
                                               return lp1;
                                             }}};
    EXPECT_EQ(CompletionJson(meta, lazy), CompletionJson(meta, given));
    EXPECT_EQ(built, 2);
  }
}

// n > 1: one choice object each, with its index and its own extension; the prompt is counted
// once in the usage and the completions are summed.
// A completion's echo: read (false unless true is sent), and each choice's text of a whole
// response begins with the prompt; a chat response has none.
TEST(OpenAiJsonTest, CompletionEchoPutsThePromptBeforeEachChoicesText) {
  auto r = ParseOpenAiRequest(ApiKind::kCompletion, R"({"prompt": "Once upon", "echo": true})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->echo);
  r = ParseOpenAiRequest(ApiKind::kCompletion, R"({"prompt": "Once upon", "echo": false})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->echo);
  r = ParseOpenAiRequest(ApiKind::kCompletion,
                         R"({"prompt": "x", "echo": true, "logprobs": null})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(ErrorOf(ApiKind::kCompletion, R"({"prompt": "x", "echo": "yes"})"),
            "echo: expected true or false, got string");

  ResponseMeta meta{ApiKind::kCompletion, "cmpl-1", 1, "smol"};
  meta.echo = "Once upon";
  std::vector<v1::Final> finals(2, SampleFinal());
  finals[0].set_text(" a time");
  finals[1].set_text("");
  const std::vector<ChoiceResult> results = {{&finals[0]}, {&finals[1]}};
  const json j = json::parse(CompletionJson(meta, results));
  EXPECT_EQ(j["choices"][0]["text"], "Once upon a time");
  EXPECT_EQ(j["choices"][1]["text"], "Once upon");
  EXPECT_EQ(j["usage"]["completion_tokens"], 2 * finals[0].usage().completion_tokens());
}

TEST(OpenAiJsonTest, SeveralChoices) {
  const ResponseMeta meta{ApiKind::kCompletion, "cmpl-1", 1, "smol"};
  std::vector<v1::Final> finals(3, SampleFinal());
  finals[0].set_text("a");
  finals[1].set_text("bb");
  finals[1].set_finish_reason("stop");
  finals[1].mutable_usage()->set_completion_tokens(5);
  finals[1].set_worker("worker-2");
  finals[2].set_text("ccc");
  const json lp = {{"tokens", json::array()}};
  const std::vector<ChoiceResult> results = {{&finals[0]}, {&finals[1], &lp}, {&finals[2]}};
  const json j = json::parse(CompletionJson(meta, results));
  ASSERT_EQ(j["choices"].size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(j["choices"][i]["index"], i);
    EXPECT_EQ(j["choices"][i]["text"], finals[i].text());
  }
  EXPECT_EQ(j["choices"][1]["finish_reason"], "stop");
  EXPECT_EQ(j["choices"][1]["logprobs"], lp);
  EXPECT_TRUE(j["choices"][0]["logprobs"].is_null());
  EXPECT_EQ(j["choices"][1]["lazyattn"]["worker"], "worker-2");
  EXPECT_EQ(j["lazyattn"]["worker"], "worker-1");
  EXPECT_EQ(j["usage"]["prompt_tokens"], 10);
  EXPECT_EQ(j["usage"]["prompt_tokens_details"]["cached_tokens"], 6);
  EXPECT_EQ(j["usage"]["completion_tokens"], 3 + 5 + 3);
  EXPECT_EQ(j["usage"]["total_tokens"], 10 + 11);
  const json usage = json::parse(UsageChunkJson(meta, finals));
  EXPECT_EQ(usage["usage"]["completion_tokens"], 11);
  EXPECT_EQ(json::parse(TextChunkJson(meta, 2, "x", false))["choices"][0]["index"], 2);
  EXPECT_EQ(json::parse(FinishChunkJson(meta, 1, finals[1], false))["lazyattn"]["worker"],
            "worker-2");
}

TEST(OpenAiJsonTest, StreamChunks) {
  const ResponseMeta chat{ApiKind::kChat, "chatcmpl-1", 1, "smol"};
  json role = json::parse(RoleChunkJson(chat, 0, true));
  EXPECT_EQ(role["object"], "chat.completion.chunk");
  EXPECT_EQ(role["choices"][0]["delta"]["role"], "assistant");
  EXPECT_TRUE(role["usage"].is_null());
  json text = json::parse(TextChunkJson(chat, 0, "Hi", false));
  EXPECT_EQ(text["choices"][0]["delta"]["content"], "Hi");
  EXPECT_TRUE(text["choices"][0]["finish_reason"].is_null());
  EXPECT_FALSE(text.contains("usage"));
  json finish = json::parse(FinishChunkJson(chat, 0, SampleFinal(), true));
  EXPECT_EQ(finish["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(finish["choices"][0]["delta"].empty());
  const v1::Final final = SampleFinal();
  json usage = json::parse(UsageChunkJson(chat, {&final, 1}));
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["total_tokens"], 13);

  const ResponseMeta completion{ApiKind::kCompletion, "cmpl-1", 1, "smol"};
  json c = json::parse(TextChunkJson(completion, 0, "abc", false));
  EXPECT_EQ(c["object"], "text_completion");
  EXPECT_EQ(c["choices"][0]["text"], "abc");
}

TEST(OpenAiJsonTest, FinishReasonsAndModels) {
  EXPECT_STREQ(OpenAiFinishReason("stop"), "stop");
  EXPECT_STREQ(OpenAiFinishReason("length"), "length");
  EXPECT_STREQ(OpenAiFinishReason("cancelled"), "stop");
  v1::ModelInfo m;
  m.set_name("SmolLM2");
  m.set_max_context_tokens(8192);
  json models = json::parse(ModelsJson({m}, 5));
  EXPECT_EQ(models["object"], "list");
  EXPECT_EQ(models["data"][0]["id"], "SmolLM2");
  EXPECT_EQ(models["data"][0]["object"], "model");
  EXPECT_EQ(models["data"][0]["max_model_len"], 8192);
  EXPECT_TRUE(json::parse(ModelsJson({}, 5))["data"].empty());
  // An id, when set, is what the model is listed and selected under; a name that is not UTF-8
  // is replaced, not thrown on.
  m.set_id("smol-135m");
  m.set_name("\xff");
  EXPECT_EQ(json::parse(ModelJson(m, 5))["id"], "smol-135m");
  m.clear_id();
  EXPECT_EQ(json::parse(ModelJson(m, 5))["id"], "\xef\xbf\xbd");
}

}  // namespace
}  // namespace lazyattn::router
