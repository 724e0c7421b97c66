// OpenAI JSON <-> lazyattn.v1: every field read, the errors naming the JSON field, and the
// response objects as OpenAI SDKs parse them.
#include "services/router/http/openai_json.h"

#include "common/request_validator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace lazyattn::router {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

std::string ErrorOf(ApiKind kind, const std::string& body) {
  auto r = ParseOpenAiRequest(kind, body);
  if (r.ok()) return "ok";
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(r.status().message());
}

TEST(OpenAiJsonTest, ChatRequestMapsEveryField) {
  auto r = ParseOpenAiRequest(ApiKind::kChat, R"({
    "model": "m", "messages": [
      {"role": "developer", "content": "Be brief."},
      {"role": "user", "content": "Hi"},
      {"role": "assistant", "content": null},
      {"role": "user", "content": [{"type": "text", "text": "Sum "}, {"type": "text", "text": "up"}]}],
    "max_tokens": 5, "max_completion_tokens": 7, "temperature": 0, "top_p": 0.5, "seed": 42,
    "stop": ["\n\n", "END"], "n": 1, "user": "u1", "presence_penalty": 0.25,
    "frequency_penalty": -0.5, "top_k": 3, "stream": true, "stream_options": {"include_usage": true},
    "documents": [{"id": "a", "text": "alpha"}, {"text": "beta"}], "cache_mode": "BLOCK",
    "some_future_field": {"ignored": [1, 2]}})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->model, "m");
  EXPECT_TRUE(r->stream);
  EXPECT_TRUE(r->include_usage);
  const auto& g = r->request;
  EXPECT_TRUE(g.chat());
  ASSERT_EQ(g.messages_size(), 4);
  EXPECT_EQ(g.messages(0).role(), "system");
  EXPECT_EQ(g.messages(2).role(), "assistant");
  EXPECT_EQ(g.messages(2).content(), "");
  EXPECT_EQ(g.messages(3).content(), "Sum up");
  EXPECT_TRUE(g.system().empty());
  EXPECT_TRUE(g.question().empty());
  EXPECT_EQ(g.sampling().max_tokens(), 7);  // max_completion_tokens wins
  EXPECT_EQ(g.sampling().temperature(), 0.0f);
  EXPECT_FLOAT_EQ(g.sampling().top_p(), 0.5f);
  ASSERT_TRUE(g.sampling().has_seed());
  EXPECT_EQ(g.sampling().seed(), 42u);
  ASSERT_EQ(g.sampling().stop_size(), 2);
  EXPECT_EQ(g.sampling().stop(0), "\n\n");
  EXPECT_FLOAT_EQ(g.sampling().presence_penalty(), 0.25f);
  EXPECT_FLOAT_EQ(g.sampling().frequency_penalty(), -0.5f);
  EXPECT_EQ(g.sampling().top_k(), 3);
  ASSERT_EQ(g.documents_size(), 2);
  EXPECT_EQ(g.documents(0).id(), "a");
  EXPECT_EQ(g.documents(0).text(), "alpha");
  EXPECT_EQ(g.documents(1).text(), "beta");
  EXPECT_EQ(g.cache_mode(), v1::CACHE_MODE_BLOCK);
}

TEST(OpenAiJsonTest, DefaultsFollowOpenAi) {
  auto r = ParseOpenAiRequest(ApiKind::kChat, R"({"messages": [{"role": "user", "content": "x"}]})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->stream);
  EXPECT_EQ(r->request.sampling().temperature(), 1.0f);  // OpenAI samples unless told otherwise
  EXPECT_FALSE(r->request.sampling().has_seed());
  EXPECT_EQ(r->request.sampling().max_tokens(), 0);  // the server's default
  EXPECT_EQ(r->request.cache_mode(), v1::CACHE_MODE_UNSPECIFIED);
}

// OpenAI's top_p 0 keeps only the most likely token; the gRPC API's top_p 0 means "off", so it
// must not pass through (it would sample the whole vocabulary). It becomes top_k 1.
TEST(OpenAiJsonTest, TopPZeroKeepsOnlyTheMostLikelyToken) {
  const std::string user = R"("messages": [{"role": "user", "content": "x"}])";
  auto sampling = [&](const std::string& extra) {
    auto r = ParseOpenAiRequest(ApiKind::kChat, "{" + user + extra + "}");
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->request.sampling() : v1::SamplingParams();
  };
  for (const char* zero :
       {R"(, "top_p": 0)", R"(, "top_p": 0.0)", R"(, "top_p": -0.0)", R"(, "top_p": 1e-9)",
        R"(, "top_p": 0, "top_k": 40)", R"(, "top_k": 40, "top_p": 0, "temperature": 1.5)"}) {
    SCOPED_TRACE(zero);
    const v1::SamplingParams s = sampling(zero);
    EXPECT_EQ(s.top_k(), 1);
    EXPECT_EQ(s.top_p(), 1.0f);
  }
  // The temperature sent is kept (and validated as usual).
  EXPECT_EQ(sampling(R"(, "top_p": 0, "temperature": 1.5)").temperature(), 1.5f);
  // Other values pass through; absent and null are off (the proto's 0).
  const v1::SamplingParams half = sampling(R"(, "top_p": 0.5, "top_k": 40)");
  EXPECT_FLOAT_EQ(half.top_p(), 0.5f);
  EXPECT_EQ(half.top_k(), 40);
  EXPECT_FLOAT_EQ(sampling(R"(, "top_p": 1e-6)").top_p(), 1e-6f);
  EXPECT_EQ(sampling(R"(, "top_p": 1e-6)").top_k(), 0);
  for (const char* off : {"", R"(, "top_p": null)"}) {
    const v1::SamplingParams s = sampling(off);
    EXPECT_EQ(s.top_p(), 0.0f) << off;
    EXPECT_EQ(s.top_k(), 0) << off;
  }
}

// Out of [0, 1] top_p reaches the shared validator unchanged (a negative value is not read as
// "keep one token"), and the client's 400 names top_p.
TEST(OpenAiJsonTest, TopPOutsideTheUnitIntervalIsRefusedNamingTopP) {
  for (const char* bad : {"1.5", "-0.5", "-1e-12", "1e20"}) {
    SCOPED_TRACE(bad);
    auto r = ParseOpenAiRequest(
        ApiKind::kChat,
        std::string(R"({"messages": [{"role": "user", "content": "x"}], "top_p": )") + bad + "}");
    ASSERT_TRUE(r.ok()) << r.status();
    const absl::Status s = ValidateGenerateRequest(r->request, ApiLimits(), 0);
    ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(ToHttpFieldNames(ApiKind::kChat, std::string(s.message())),
                ::testing::StartsWith("top_p: "));
  }
}

TEST(OpenAiJsonTest, CompletionPromptIsTheQuestionWithoutTemplate) {
  auto r = ParseOpenAiRequest(ApiKind::kCompletion,
                              R"({"prompt": ["Once upon"], "stop": "\n", "temperature": 0.0})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->request.chat());
  EXPECT_EQ(r->request.question(), "Once upon");
  ASSERT_EQ(r->request.sampling().stop_size(), 1);
  EXPECT_EQ(r->request.sampling().stop(0), "\n");
  EXPECT_EQ(ErrorOf(ApiKind::kCompletion, R"({"prompt": ["a", "b"]})").substr(0, 7), "prompt:");
  EXPECT_EQ(ErrorOf(ApiKind::kCompletion, R"({"prompt": [1]})"),
            "prompt[0]: expected a string, got number");
}

TEST(OpenAiJsonTest, ErrorsNameTheJsonField) {
  const ApiKind chat = ApiKind::kChat;
  const std::string user = R"("messages": [{"role": "user", "content": "x"}])";
  EXPECT_EQ(ErrorOf(chat, "not json"), "body: not valid JSON");
  EXPECT_EQ(ErrorOf(chat, "[1]"), "body: expected a JSON object");
  EXPECT_EQ(ErrorOf(chat, "{}"), "messages: missing (a list of chat messages)");
  EXPECT_EQ(ErrorOf(chat, R"({"messages": []})"), "messages: empty list");
  EXPECT_EQ(ErrorOf(chat, R"({"messages": [{"role": "tool", "content": "x"}]})").substr(0, 17),
            "messages[0].role:");
  EXPECT_EQ(ErrorOf(chat, R"({"messages": [{"role": "user"}]})"), "messages[0].content: missing");
  EXPECT_EQ(ErrorOf(chat, R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})"),
            "messages[0].content[0].type: only text parts are supported");
  EXPECT_EQ(ErrorOf(chat, "{" + user + R"(, "n": 2})"), "n: only 1 choice is supported, got 2");
  EXPECT_EQ(ErrorOf(chat, "{" + user + R"(, "max_tokens": 0})"),
            "max_tokens: must be at least 1, got 0");
  EXPECT_EQ(ErrorOf(chat, "{" + user + R"(, "max_tokens": 2.5})"),
            "max_tokens: expected an integer, got 2.5");
  // A hostile value is named by its type, never echoed back.
  const std::string big(100000, 'x');
  EXPECT_EQ(ErrorOf(chat, "{" + user + R"(, "max_tokens": ")" + big + R"("})"),
            "max_tokens: expected an integer, got string");
  EXPECT_EQ(ErrorOf(chat, "{" + user + R"(, "seed": {"a": [1, 2, 3]}})"),
            "seed: expected an integer, got object");
  EXPECT_EQ(ErrorOf(chat, "{" + user + R"(, "temperature": "hot"})"),
            "temperature: expected a number, got string");
  EXPECT_EQ(ErrorOf(chat, "{" + user + R"(, "stop": 3})"),
            "stop: expected a string or a list of strings, got number");
  EXPECT_EQ(ErrorOf(chat, "{" + user + R"(, "stop": ["a", 1]})"),
            "stop[1]: expected a string, got number");
  EXPECT_EQ(ErrorOf(chat, "{" + user + R"(, "stream": "yes"})"), "stream: expected true or false");
  EXPECT_EQ(ErrorOf(chat, "{" + user + R"(, "documents": [{"id": "a"}]})"),
            "documents[0].text: missing");
  EXPECT_EQ(ErrorOf(chat, "{" + user + R"(, "documents": {"text": "a"}})"),
            "documents: expected a list, got object");
  EXPECT_EQ(ErrorOf(chat, "{" + user + R"(, "cache_mode": "radix"})"),
            "cache_mode: expected lazy, block, prefix or full");
  EXPECT_EQ(ErrorOf(chat, "{" + user + R"(, "model": 7})"), "model: expected a string, got number");
  // Nulls are "not set", as OpenAI reads them.
  EXPECT_EQ(ErrorOf(chat, "{" + user + R"(, "max_tokens": null, "stop": null, "n": null})"), "ok");
}

TEST(OpenAiJsonTest, DeepNestingIsRefusedNotRecursed) {
  const std::string deep = R"({"x": )" + std::string(100000, '[') + std::string(100000, ']') + "}";
  EXPECT_THAT(ErrorOf(ApiKind::kChat, deep), HasSubstr("body: JSON nested deeper than 64"));
}

TEST(OpenAiJsonTest, FieldNamesOfSharedValidatorMessages) {
  EXPECT_EQ(ToHttpFieldNames(ApiKind::kChat, "sampling.max_tokens: 9999 outside [0, 4096]"),
            "max_tokens: 9999 outside [0, 4096]");
  EXPECT_EQ(ToHttpFieldNames(ApiKind::kCompletion, "question: empty question and no documents"),
            "prompt: empty question and no documents");
  EXPECT_EQ(ToHttpFieldNames(ApiKind::kChat, "documents[0].text: empty document"),
            "documents[0].text: empty document");
}

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
  const json j = json::parse(CompletionJson(meta, "Hello", SampleFinal()));
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
}

TEST(OpenAiJsonTest, StreamChunks) {
  const ResponseMeta chat{ApiKind::kChat, "chatcmpl-1", 1, "smol"};
  json role = json::parse(RoleChunkJson(chat, true));
  EXPECT_EQ(role["object"], "chat.completion.chunk");
  EXPECT_EQ(role["choices"][0]["delta"]["role"], "assistant");
  EXPECT_TRUE(role["usage"].is_null());
  json text = json::parse(TextChunkJson(chat, "Hi", false));
  EXPECT_EQ(text["choices"][0]["delta"]["content"], "Hi");
  EXPECT_TRUE(text["choices"][0]["finish_reason"].is_null());
  EXPECT_FALSE(text.contains("usage"));
  json finish = json::parse(FinishChunkJson(chat, SampleFinal(), true));
  EXPECT_EQ(finish["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(finish["choices"][0]["delta"].empty());
  json usage = json::parse(UsageChunkJson(chat, SampleFinal()));
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["total_tokens"], 13);

  const ResponseMeta completion{ApiKind::kCompletion, "cmpl-1", 1, "smol"};
  json c = json::parse(TextChunkJson(completion, "abc", false));
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
  json models = json::parse(ModelsJson(&m, 5));
  EXPECT_EQ(models["object"], "list");
  EXPECT_EQ(models["data"][0]["id"], "SmolLM2");
  EXPECT_EQ(models["data"][0]["object"], "model");
  EXPECT_TRUE(json::parse(ModelsJson(nullptr, 5))["data"].empty());
}

}  // namespace
}  // namespace lazyattn::router
