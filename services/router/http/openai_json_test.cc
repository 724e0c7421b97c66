// OpenAI JSON -> lazyattn.v1: every request field read, and the errors naming the JSON field.
#include "services/router/http/openai_json.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/request_validator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/router/http/error_mapping.h"
#include "services/router/http/openai_json_test_util.h"

namespace lazyattn::router {
namespace {

using ::testing::ElementsAre;
using testing::ErrorOf;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

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
  // Accepted, not read, and reported for the log.
  EXPECT_THAT(r->unknown_fields, ElementsAre("some_future_field"));
}

TEST(OpenAiJsonTest, DefaultsFollowOpenAi) {
  auto r =
      ParseOpenAiRequest(ApiKind::kChat, R"({"messages": [{"role": "user", "content": "x"}]})");
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
  EXPECT_THAT(ErrorOf(ApiKind::kCompletion, R"({"prompt": ["a", "b"]})"),
              ::testing::AllOf(::testing::StartsWith("prompt: a list must hold exactly one string"),
                               ::testing::EndsWith("got a list of 2")));
  EXPECT_EQ(ErrorOf(ApiKind::kCompletion, "{}"), "prompt: missing (a string)");
  EXPECT_EQ(ErrorOf(ApiKind::kCompletion, R"({"prompt": [1]})"),
            "prompt[0]: expected a string, got number");
}

TEST(OpenAiJsonTest, ErrorsNameTheJsonField) {
  const ApiKind chat = ApiKind::kChat;
  const std::string user = R"("messages": [{"role": "user", "content": "x"}])";
  EXPECT_EQ(ErrorOf(chat, "not json"), "body: not valid JSON");
  EXPECT_EQ(ErrorOf(chat, "[1]"), "body: expected a JSON object, got array");
  EXPECT_EQ(ErrorOf(chat, "{}"), "messages: missing (a list of chat messages)");
  EXPECT_EQ(ErrorOf(chat, R"({"messages": []})"),
            "messages: expected at least one message, got an empty list");
  EXPECT_EQ(ErrorOf(chat, R"({"messages": [{"role": "tool", "content": "x"}]})"),
            "messages[0].role: expected system, developer, user or assistant (tool and function "
            "messages are not supported), got \"tool\"");
  EXPECT_EQ(ErrorOf(chat, R"({"messages": [3]})"),
            "messages[0]: expected an object with role and content, got number");
  EXPECT_EQ(ErrorOf(chat, R"({"messages": [{"role": "user"}]})"),
            "messages[0].content: missing (a string or a list of text parts)");
  EXPECT_EQ(
      ErrorOf(chat, R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})"),
      "messages[0].content[0].type: only text parts are supported, got \"image_url\"");
  EXPECT_EQ(ErrorOf(chat, "{" + user + R"(, "n": 0})"), "n: expected 1 to 128, got 0");
  EXPECT_EQ(ErrorOf(chat, "{" + user + R"(, "n": 129})"), "n: expected 1 to 128, got 129");
  EXPECT_EQ(ErrorOf(chat, "{" + user + R"(, "n": -1})"), "n: expected 1 to 128, got -1");
  EXPECT_EQ(ErrorOf(chat, "{" + user + R"(, "n": 1.5})"), "n: expected an integer, got 1.5");
  EXPECT_EQ(ErrorOf(chat, "{" + user + R"(, "n": "2"})"), "n: expected an integer, got string");
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
  EXPECT_EQ(ErrorOf(chat, "{" + user + R"(, "stream": "yes"})"),
            "stream: expected true or false, got string");
  EXPECT_EQ(ErrorOf(chat, "{" + user + R"(, "stream_options": true})"),
            "stream_options: expected an object, got boolean");
  // Only with a stream, as OpenAI and vLLM have it; an empty object says nothing and passes.
  EXPECT_EQ(ErrorOf(chat, "{" + user + R"(, "stream_options": {"include_usage": true}})"),
            "stream_options: only allowed when stream is true");
  EXPECT_EQ(ErrorOf(chat, "{" + user +
                              R"(, "stream": false, "stream_options": {"include_usage": false}})"),
            "stream_options: only allowed when stream is true");
  EXPECT_TRUE(ParseOpenAiRequest(ApiKind::kChat, "{" + user + R"(, "stream_options": {}})").ok());
  EXPECT_EQ(ErrorOf(chat, "{" + user + R"(, "documents": [{"id": "a"}]})"),
            "documents[0].text: missing (a string)");
  EXPECT_EQ(ErrorOf(chat, "{" + user + R"(, "documents": ["a"]})"),
            R"(documents[0]: expected an object {"id": ..., "text": ...}, got string)");
  EXPECT_EQ(ErrorOf(chat, "{" + user + R"(, "top_k": -1})"),
            "top_k: expected 0 to 2147483647, got -1");
  EXPECT_EQ(ErrorOf(chat, "{" + user + R"(, "seed": 18446744073709551615})"),
            "seed: expected an integer from -9223372036854775808 to 9223372036854775807 (a signed "
            "64-bit integer), got 18446744073709551615");
  EXPECT_EQ(ErrorOf(chat, "{" + user + R"(, "temperature": 1e31})"),
            "temperature: expected a number within [-1e30, 1e30], got 1e+31");
  EXPECT_EQ(ErrorOf(chat, "{" + user + R"(, "documents": {"text": "a"}})"),
            "documents: expected a list, got object");
  EXPECT_EQ(ErrorOf(chat, "{" + user + R"(, "cache_mode": "radix"})"),
            "cache_mode: expected lazy, block, prefix or full, got \"radix\"");
  // A long string is quoted cut short, on a character boundary (é is two bytes: 16 fit in 32).
  std::string accents;
  for (int i = 0; i < 1000; ++i) accents += "\xc3\xa9";
  EXPECT_EQ(
      ErrorOf(chat, "{" + user + R"(, "cache_mode": ")" + big + R"("})"),
      "cache_mode: expected lazy, block, prefix or full, got \"" + std::string(32, 'x') + "...\"");
  EXPECT_EQ(ErrorOf(chat, "{" + user + R"(, "cache_mode": "x)" + accents + R"("})"),
            "cache_mode: expected lazy, block, prefix or full, got \"x" + accents.substr(0, 30) +
                "...\"");
  EXPECT_EQ(ErrorOf(chat, "{" + user + R"(, "model": 7})"), "model: expected a string, got number");
  // Nulls are "not set", as OpenAI reads them.
  EXPECT_EQ(ErrorOf(chat, "{" + user + R"(, "max_tokens": null, "stop": null, "n": null})"), "ok");
}

// OpenAI fields the router does not implement, set to a value an answer that ignored them would
// betray (a tool call it never makes, JSON it never enforces), and counts of alternatives out of
// bounds: 400 naming the field (the error's `param`), saying what was expected and quoting what
// came.
TEST(OpenAiJsonTest, FieldsThatWouldChangeTheAnswerAreRefusedNamingTheField) {
  const std::string user = R"("messages": [{"role": "user", "content": "x"}])";
  struct Case {
    ApiKind kind;
    std::string field;
    std::string extra;
    std::string message;
  };
  const ApiKind chat = ApiKind::kChat;
  const ApiKind text = ApiKind::kCompletion;
  const std::vector<Case> cases = {
      {text, "top_logprobs", R"("logprobs": 3, "top_logprobs": 3)",
       "top_logprobs: not supported (a completion counts its alternatives in logprobs: n), got 3"},
      {text, "echo", R"("echo": true, "logprobs": 0)",
       "echo: not supported (with logprobs: the prompt's log probabilities are not computed), got "
       "true"},
      {chat, "echo", R"("echo": true)",
       "echo: not supported (chat messages are not echoed), got true"},
      {text, "best_of", R"("best_of": 3)",
       "best_of: not supported (candidates are not ranked; only best_of equal to n), got 3"},
      {text, "best_of", R"("best_of": 3, "n": 2)",
       "best_of: not supported (candidates are not ranked; only best_of equal to n), got 3"},
      {text, "best_of", R"("best_of": 2, "n": 3)", "best_of: must be at least n (3), got 2"},
      // An n refused on its own is named, not best_of.
      {text, "n", R"("best_of": 1, "n": 0)", "n: expected 1 to 128, got 0"},
      {text, "n", R"("best_of": 2, "n": "2")", "n: expected an integer, got string"},
      {text, "suffix", R"("suffix": "}")",
       R"(suffix: not supported (no text is inserted after the completion), got "}")"},
      {chat, "tools", R"("tools": [{"type": "function", "function": {"name": "f"}}])",
       "tools: not supported (tool calling is not supported), got a list of 1"},
      {chat, "functions", R"("functions": [{"name": "f"}])",
       "functions: not supported (tool calling is not supported), got a list of 1"},
      {chat, "tool_choice", R"("tool_choice": "required")",
       R"(tool_choice: not supported (tool calling is not supported; only "none" or "auto"))"
       R"(, got "required")"},
      {chat, "tool_choice", R"("tool_choice": {"type": "function", "function": {"name": "f"}})",
       R"(tool_choice: not supported (tool calling is not supported; only "none" or "auto"))"
       R"(, got object)"},
      {chat, "function_call", R"("function_call": {"name": "f"})",
       R"(function_call: not supported (tool calling is not supported; only "none" or "auto"))"
       R"(, got object)"},
      {chat, "response_format", R"("response_format": {"type": "json_object"})",
       R"(response_format: not supported (output is not constrained; only {"type": "text"}))"
       R"(, got "json_object")"},
      {chat, "response_format", R"("response_format": {"type": "json_schema", "json_schema": {}})",
       R"(response_format: not supported (output is not constrained; only {"type": "text"}))"
       R"(, got "json_schema")"},
      {chat, "modalities", R"("modalities": ["text", "audio"])",
       R"(modalities: not supported (the router answers in text only), got "audio")"},
      {chat, "audio", R"("audio": {"voice": "alloy", "format": "wav"})",
       "audio: not supported (the router answers in text only), got object"},
      {chat, "guided_json", R"("guided_json": {"type": "object"})",
       "guided_json: not supported (output is not constrained), got object"},
      {text, "guided_choice", R"("guided_choice": ["a", "b"])",
       "guided_choice: not supported (output is not constrained), got array"},
      // Wrong types name the field too.
      {chat, "logprobs", R"("logprobs": "yes")", "logprobs: expected true or false, got string"},
      // A number of the wrong kind is quoted as sent (as `n` and `max_tokens` are).
      {chat, "logprobs", R"("logprobs": 1)", "logprobs: expected true or false, got 1"},
      {text, "logprobs", R"("logprobs": true)", "logprobs: expected an integer, got boolean"},
      {text, "logprobs", R"("logprobs": -1)", "logprobs: expected an integer in [0, 20], got -1"},
      {text, "logprobs", R"("logprobs": 21)", "logprobs: expected an integer in [0, 20], got 21"},
      {text, "logprobs", R"("logprobs": 2.5)", "logprobs: expected an integer, got 2.5"},
      {text, "logprobs", R"("logprobs": "5")", "logprobs: expected an integer, got string"},
      {chat, "top_logprobs", R"("logprobs": true, "top_logprobs": -2)",
       "top_logprobs: expected an integer in [0, 20], got -2"},
      {chat, "top_logprobs", R"("logprobs": true, "top_logprobs": 21)",
       "top_logprobs: expected an integer in [0, 20], got 21"},
      {chat, "top_logprobs", R"("logprobs": true, "top_logprobs": 1e9)",
       "top_logprobs: expected an integer in [0, 20], got 1000000000.0"},
      {chat, "top_logprobs", R"("logprobs": true, "top_logprobs": 1.5)",
       "top_logprobs: expected an integer, got 1.5"},
      {chat, "top_logprobs", R"("logprobs": true, "top_logprobs": 1e300)",
       "top_logprobs: expected an integer, got 1e+300"},
      {text, "top_logprobs", R"("top_logprobs": 0.5)",
       "top_logprobs: expected an integer, got 0.5"},
      {chat, "top_logprobs", R"("logprobs": true, "top_logprobs": true)",
       "top_logprobs: expected an integer, got boolean"},
      // Alternatives come beside the chosen token's own, as OpenAI's.
      {chat, "top_logprobs", R"("top_logprobs": 3)",
       "top_logprobs: needs logprobs: true, got 3 with logprobs unset"},
      {chat, "top_logprobs", R"("logprobs": false, "top_logprobs": 3)",
       "top_logprobs: needs logprobs: true, got 3 with logprobs false"},
      {text, "best_of", R"("best_of": 0)", "best_of: must be at least n (1), got 0"},
      {text, "best_of", R"("best_of": 1.5)", "best_of: expected an integer, got 1.5"},
      {text, "best_of", R"("best_of": 1e20)", "best_of: expected an integer, got 1e+20"},
      {text, "suffix", R"("suffix": 7)", "suffix: expected a string, got 7"},
      {chat, "tools", R"("tools": {})", "tools: expected a list, got object"},
      {chat, "response_format", R"("response_format": "json")",
       "response_format: expected an object, got string"},
      {chat, "response_format", R"("response_format": {})",
       R"(response_format: expected {"type": "text"}, got type missing)"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.extra);
    const std::string head = c.kind == chat ? user : R"("prompt": "x")";
    const std::string message = ErrorOf(c.kind, "{" + head + ", " + c.extra + "}");
    EXPECT_EQ(message, c.message);
    EXPECT_EQ(ParamOf(message), c.field);
  }
}

// Their unset and default values change nothing and are accepted; so are the fields that are
// harmless to ignore. None of these is reported as unknown.
TEST(OpenAiJsonTest, DefaultValuesAndHarmlessFieldsAreAccepted) {
  const std::string chat_body = R"({"messages": [{"role": "user", "content": "x"}],
    "logprobs": false, "top_logprobs": 0, "echo": false, "best_of": 1, "suffix": "",
    "logit_bias": {}, "tools": [], "functions": [], "tool_choice": "none",
    "function_call": "auto", "response_format": {"type": "text"}, "modalities": ["text"],
    "audio": null, "guided_json": null, "user": "u", "metadata": {"team": "a"}, "store": true,
    "service_tier": "auto", "parallel_tool_calls": true, "prediction": {"type": "content"},
    "stream": true, "stream_options": {"include_usage": false, "continuous_usage_stats": true}})";
  auto r = ParseOpenAiRequest(ApiKind::kChat, chat_body);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->unknown_fields, IsEmpty());
  auto c = ParseOpenAiRequest(ApiKind::kCompletion,
                              R"({"prompt": "x", "logprobs": null, "echo": false, "best_of": 1,
                                  "suffix": null, "tool_choice": "auto"})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_THAT(c->unknown_fields, IsEmpty());
  // best_of equal to n is n alone.
  auto three = ParseOpenAiRequest(ApiKind::kCompletion, R"({"prompt": "x", "n": 3, "best_of": 3})");
  ASSERT_TRUE(three.ok()) << three.status();
  EXPECT_EQ(three->choices, 3);
}

// The chosen tokens' log probabilities and their alternatives: chat's logprobs true with
// top_logprobs k, and a completion's logprobs n, set SamplingParams.logprobs and top_logprobs;
// false, null and absent ask for nothing.
TEST(OpenAiJsonTest, LogprobsAndTheirAlternativesAreAskedFor) {
  const std::string user = R"("messages": [{"role": "user", "content": "x"}])";
  struct Case {
    ApiKind kind;
    std::string body;
    bool logprobs;
    int top_logprobs;
  };
  const std::vector<Case> cases = {
      {ApiKind::kChat, "{" + user + R"(, "logprobs": true})", true, 0},
      {ApiKind::kChat, "{" + user + R"(, "logprobs": true, "top_logprobs": 0})", true, 0},
      {ApiKind::kChat, "{" + user + R"(, "logprobs": true, "top_logprobs": 1})", true, 1},
      {ApiKind::kChat, "{" + user + R"(, "logprobs": true, "top_logprobs": 5.0})", true, 5},
      {ApiKind::kChat, "{" + user + R"(, "logprobs": true, "top_logprobs": 20})", true, 20},
      {ApiKind::kChat, "{" + user + R"(, "logprobs": true, "top_logprobs": null})", true, 0},
      {ApiKind::kChat, "{" + user + R"(, "logprobs": false})", false, 0},
      {ApiKind::kChat, "{" + user + R"(, "logprobs": false, "top_logprobs": 0})", false, 0},
      {ApiKind::kChat, "{" + user + "}", false, 0},
      {ApiKind::kCompletion, R"({"prompt": "x", "logprobs": 0})", true, 0},
      {ApiKind::kCompletion, R"({"prompt": "x", "logprobs": 0.0})", true, 0},
      {ApiKind::kCompletion, R"({"prompt": "x", "logprobs": 3})", true, 3},
      {ApiKind::kCompletion, R"({"prompt": "x", "logprobs": 20})", true, 20},
      {ApiKind::kCompletion, R"({"prompt": "x", "logprobs": 2, "top_logprobs": 0})", true, 2},
      {ApiKind::kCompletion, R"({"prompt": "x", "logprobs": null})", false, 0},
      {ApiKind::kCompletion, R"({"prompt": "x"})", false, 0},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.body);
    auto r = ParseOpenAiRequest(c.kind, c.body);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->request.sampling().logprobs(), c.logprobs);
    EXPECT_EQ(r->request.sampling().top_logprobs(), c.top_logprobs);
    EXPECT_THAT(r->unknown_fields, IsEmpty());
  }
}

// Anything else is accepted (SDKs add fields) and named for the log, sorted, bounded in number
// and length; a field of the other endpoint counts as unknown.
TEST(OpenAiJsonTest, UnknownFieldsAreAcceptedAndReported) {
  auto r = ParseOpenAiRequest(
      ApiKind::kChat,
      R"({"messages": [{"role": "user", "content": "x"}], "reasoning_effort": "low",
          "prompt": "p", "x_trace": {"id": 1}})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->unknown_fields, ElementsAre("prompt", "reasoning_effort", "x_trace"));

  std::string body = R"({"prompt": "x", ")" + std::string(1000, 'a') + R"(": 1)";
  for (int i = 0; i < 100; ++i) body += absl::StrCat(R"(, "f)", i, R"(": 1)");
  body += "}";
  auto many = ParseOpenAiRequest(ApiKind::kCompletion, body);
  ASSERT_TRUE(many.ok()) << many.status();
  ASSERT_EQ(many->unknown_fields.size(), kMaxUnknownFields);
  EXPECT_EQ(many->unknown_fields[0], std::string(kMaxFieldNameBytes, 'a') + "...");
  EXPECT_EQ(many->unknown_fields[1], "f0");
}

TEST(OpenAiJsonTest, DeepNestingIsRefusedNotRecursed) {
  const std::string deep = R"({"x": )" + std::string(100000, '[') + std::string(100000, ']') + "}";
  EXPECT_THAT(ErrorOf(ApiKind::kChat, deep), HasSubstr("body: JSON nested deeper than 64"));
}

// The depth limit is applied by a scan of the raw body (a parse callback applied it, which made
// parsing quadratic in the number of objects), to the parser's own count: a value may have 64
// containers around it. The body's object and 63 lists may hold a value; 64 lists only an empty
// one.
TEST(OpenAiJsonTest, TheDepthLimitIsExact) {
  const ApiKind text = ApiKind::kCompletion;
  const std::string deep = "body: JSON nested deeper than 64 levels";
  auto lists = [](int n, const std::string& inner) {
    return R"({"prompt": "p", "x": )" + std::string(n, '[') + inner + std::string(n, ']') + "}";
  };
  EXPECT_EQ(ErrorOf(text, lists(63, "1")), "ok");
  EXPECT_EQ(ErrorOf(text, lists(63, "{}")), "ok");
  EXPECT_EQ(ErrorOf(text, lists(64, "")), "ok");
  EXPECT_EQ(ErrorOf(text, lists(64, " \n ")), "ok");
  EXPECT_EQ(ErrorOf(text, lists(64, "1")), deep);
  EXPECT_EQ(ErrorOf(text, lists(64, R"("")")), deep);
  EXPECT_EQ(ErrorOf(text, lists(64, "[]")), deep);
  EXPECT_EQ(ErrorOf(text, lists(65, "")), deep);
  // Objects count as lists do; a key is a value's place.
  auto objects = [](int n, const std::string& inner) {
    std::string body = R"({"prompt": "p", "x": )";
    for (int i = 0; i < n; ++i) body += R"({"a": )";
    return body + inner + std::string(n, '}') + "}";
  };
  EXPECT_EQ(ErrorOf(text, objects(63, "1")), "ok");
  EXPECT_EQ(ErrorOf(text, objects(63, "{}")), "ok");
  EXPECT_EQ(ErrorOf(text, objects(64, "1")), deep);
  EXPECT_EQ(ErrorOf(text, objects(63, R"({"k": 1})")), deep);
  // At the deepest a body may be, a number beyond a double's range elsewhere is still named as
  // such (its finder once allowed one level less than the scan).
  const std::string at_limit = R"({"prompt": "p", "x": )" + std::string(64, '[') +
                               std::string(64, ']') + R"(, "max_tokens": 1e400})";
  EXPECT_EQ(ErrorOf(text, at_limit).rfind("max_tokens: 1e400 is out of range", 0), 0u)
      << ErrorOf(text, at_limit);
  // Past the limit and then invalid: the depth is named.
  EXPECT_EQ(ErrorOf(text, lists(70, "")), deep);
  EXPECT_EQ(ErrorOf(text, std::string(100, '[')), "body: JSON nested deeper than 64 levels");
}

// Brackets inside strings are text, not nesting, whatever escapes the strings hold; an escaped
// backslash does not escape the quote after it.
TEST(OpenAiJsonTest, BracketsInStringsAreNotNesting) {
  const ApiKind text = ApiKind::kCompletion;
  const std::string brackets = std::string(100, '[') + std::string(100, '{');
  const std::string body = R"({"prompt": ")" + brackets + R"(", "x": "\")" + brackets +
                           R"(\"", "y": ["\\\"", ")" + brackets + R"("], ")" + brackets +
                           R"(": {"\u005b": "]]]"}})";
  auto r = ParseOpenAiRequest(text, body);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->request.question(), brackets);
  // After a string that ends in an escaped backslash, brackets are nesting again.
  EXPECT_EQ(ErrorOf(text, R"({"prompt": "\\", "x": )" + std::string(70, '[') +
                              std::string(70, ']') + "}"),
            "body: JSON nested deeper than 64 levels");
  EXPECT_EQ(ErrorOf(text, R"({"prompt": "a\"b", "x": )" + std::string(70, '[') +
                              std::string(70, ']') + "}"),
            "body: JSON nested deeper than 64 levels");
}

// nlohmann's lexer reads a NUL as the end of the input, so a body with one after its object (and
// anything after it) was accepted as the object. JSON has no place for a raw NUL: refused, where
// it is, inside a string too; escaped, it is text.
TEST(OpenAiJsonTest, ANulByteIsNotJson) {
  const ApiKind text = ApiKind::kCompletion;
  const std::string body = R"({"prompt": "Hi", "max_tokens": 2})";
  const std::string nul(1, '\0');
  EXPECT_EQ(ErrorOf(text, body + nul + "garbage"),
            absl::StrCat("body: not valid JSON (a NUL byte at offset ", body.size(), ")"));
  EXPECT_EQ(ErrorOf(text, body + nul),
            absl::StrCat("body: not valid JSON (a NUL byte at offset ", body.size(), ")"));
  EXPECT_EQ(ErrorOf(text, R"({"prompt": "H)" + nul + R"(i"})"),
            "body: not valid JSON (a NUL byte at offset 13)");
  EXPECT_EQ(ErrorOf(text, nul), "body: not valid JSON (a NUL byte at offset 0)");
  auto r = ParseOpenAiRequest(text, "{\"prompt\": \"H\\u0000i\"}");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->request.question(), std::string("H\0i", 3));
}

// `stop` sent as one string is held as a list of one: a message about it names `stop` (its
// `param`), not `stop[0]`; an entry of a list keeps its index.
// vLLM's cache_salt is read into the request (it was accepted and ignored): a string; null and
// "" set none; another type is refused naming the field; an oversized one is the validator's.
TEST(OpenAiJsonTest, CacheSaltIsRead) {
  const std::string user = R"({"messages": [{"role": "user", "content": "x"}], )";
  auto salted = ParseOpenAiRequest(ApiKind::kChat, user + R"("cache_salt": "tenant-7"})");
  ASSERT_TRUE(salted.ok()) << salted.status();
  EXPECT_EQ(salted->request.cache_salt(), "tenant-7");
  EXPECT_THAT(salted->unknown_fields, IsEmpty());
  for (const char* none : {"null", R"("")"}) {
    auto r = ParseOpenAiRequest(ApiKind::kCompletion,
                                absl::StrCat(R"({"prompt": "x", "cache_salt": )", none, "}"));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->request.cache_salt(), "");
  }
  // Any string: a NUL (escaped, as JSON wants it) is part of the salt, not its end.
  auto nul = ParseOpenAiRequest(ApiKind::kChat, user + R"("cache_salt": "a\u0000b"})");
  ASSERT_TRUE(nul.ok()) << nul.status();
  EXPECT_EQ(nul->request.cache_salt(), std::string("a\0b", 3));
  auto number = ParseOpenAiRequest(ApiKind::kChat, user + R"("cache_salt": 7})");
  ASSERT_FALSE(number.ok());
  EXPECT_THAT(number.status().message(), HasSubstr("cache_salt: expected a string"));
  auto huge =
      ParseOpenAiRequest(ApiKind::kChat, user + R"("cache_salt": ")" +
                                             std::string(kMaxCacheSaltBytes + 1, 's') + R"("})");
  ASSERT_TRUE(huge.ok()) << huge.status();
  EXPECT_THAT(std::string(ValidateGenerateRequest(huge->request, ApiLimits(), 0).message()),
              HasSubstr("cache_salt: 1025 bytes, the limit is 1024"));
}

TEST(OpenAiJsonTest, AStopStringIsNamedStop) {
  const std::string user = R"({"messages": [{"role": "user", "content": "x"}], )";
  struct Case {
    std::string stop;
    std::string message;
  };
  for (const Case& c : std::vector<Case>{{R"("")", "stop: empty stop string"},
                                         {R"([""])", "stop[0]: empty stop string"},
                                         {R"(["a", ""])", "stop[1]: empty stop string"}}) {
    SCOPED_TRACE(c.stop);
    auto r = ParseOpenAiRequest(ApiKind::kChat, user + R"("stop": )" + c.stop + "}");
    ASSERT_TRUE(r.ok()) << r.status();
    const absl::Status s = ValidateGenerateRequest(r->request, ApiLimits(), 0);
    ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    const std::string message = ToHttpFieldNames(*r, std::string(s.message()));
    EXPECT_EQ(message, c.message);
    EXPECT_EQ(ParamOf(message), c.message.substr(0, c.message.find(':')));
  }
}

TEST(OpenAiJsonTest, FieldNamesOfSharedValidatorMessages) {
  // The HTTP API refuses max_tokens 0 itself: its range starts at 1.
  EXPECT_EQ(ToHttpFieldNames(ApiKind::kChat, "sampling.max_tokens: 9999 outside [0, 4096]"),
            "max_tokens: 9999 outside [1, 4096]");
  EXPECT_EQ(ToHttpFieldNames(ApiKind::kCompletion, "question: must not be empty"),
            "prompt: must not be empty");
  EXPECT_EQ(ToHttpFieldNames(ApiKind::kChat, "documents[0].text: empty document"),
            "documents[0].text: empty document");
  // An entry of logit_bias by its JSON key; the field is the map.
  EXPECT_EQ(ToHttpFieldNames(ApiKind::kCompletion, "sampling.logit_bias[-3]: negative token id -3"),
            "logit_bias: key \"-3\": negative token id -3");
  EXPECT_EQ(ToHttpFieldNames(ApiKind::kChat, "sampling.logit_bias: 301 entries"),
            "logit_bias: 301 entries");
  // The worker's whole prompt is a chat request's messages (chat has no `prompt`); a completion's
  // is its prompt.
  const std::string full = "prompt: 8192 tokens leave no room in the model's context of 8192";
  EXPECT_EQ(ToHttpFieldNames(ApiKind::kChat, full),
            "messages: 8192 tokens leave no room in the model's context of 8192 (the prompt: the "
            "messages, the documents and the chat template)");
  EXPECT_EQ(ToHttpFieldNames(ApiKind::kCompletion, full), full);
}

// A max_tokens the shared validator refuses is reported under the field the client used and with
// the value it sent: a value beyond int32 reaches the validator as int32's max, which its message
// would otherwise quote.
TEST(OpenAiJsonTest, MaxTokensMessagesNameTheFieldAndTheValueAsSent) {
  const std::string user = R"({"messages": [{"role": "user", "content": "x"}], )";
  struct Case {
    std::string fields;
    std::string message;
  };
  for (const Case& c : std::vector<Case>{
           {R"("max_tokens": 10000000000})", "max_tokens: 10000000000 outside [1, 4096]"},
           {R"("max_tokens": 1e10})", "max_tokens: 10000000000 outside [1, 4096]"},
           {R"("max_completion_tokens": 5000})", "max_completion_tokens: 5000 outside [1, 4096]"},
           {R"("max_tokens": 5, "max_completion_tokens": 2147483648})",
            "max_completion_tokens: 2147483648 outside [1, 4096]"},
           {R"("max_tokens": 2147483647})", "max_tokens: 2147483647 outside [1, 4096]"},
           // Beyond what an int64 holds, or a float too large to read as one: as out of range.
           {R"("max_tokens": 18446744073709551615})",
            "max_tokens: 18446744073709551615 outside [1, 4096]"},
           {R"("max_tokens": 9223372036854775808})",
            "max_tokens: 9223372036854775808 outside [1, 4096]"},
           {R"("max_completion_tokens": 1e20})", "max_completion_tokens: 1e+20 outside [1, 4096]"},
           {R"("max_tokens": 1e16})", "max_tokens: 1e+16 outside [1, 4096]"}}) {
    SCOPED_TRACE(c.fields);
    auto r = ParseOpenAiRequest(ApiKind::kChat, user + c.fields);
    ASSERT_TRUE(r.ok()) << r.status();
    const absl::Status s = ValidateGenerateRequest(r->request, ApiLimits(), 0);
    ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(ToHttpFieldNames(*r, std::string(s.message())), c.message);
    EXPECT_EQ(ParamOf(ToHttpFieldNames(*r, std::string(s.message()))),
              c.message.substr(0, c.message.find(':')));
  }
  // Other messages as ToHttpFieldNames(kind, ...) has them.
  auto r = ParseOpenAiRequest(ApiKind::kChat, user + R"("max_completion_tokens": 9})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(ToHttpFieldNames(*r, "sampling.top_p: 2 outside [0, 1]"), "top_p: 2 outside [0, 1]");
}

// nlohmann refuses a number beyond a double's range as a parse error; the message names the field
// and quotes the number as sent, instead of "body: not valid JSON".
TEST(OpenAiJsonTest, ANumberBeyondADoublesRangeIsNamedAsSent) {
  const std::string user = R"("messages": [{"role": "user", "content": "x"}])";
  struct Case {
    std::string body;
    std::string message;
  };
  for (const Case& c : std::vector<Case>{
           {"{" + user + R"(, "n": 1e400})", "n: 1e400 is out of range"},
           {"{" + user + R"(, "temperature": -1E+999})", "temperature: -1E+999 is out of range"},
           {R"({"max_tokens": 1e400, )" + user + "}", "max_tokens: 1e400 is out of range"},
           {"{" + user + R"(, "logit_bias": {"7": 1, "42": 1e400}})",
            "logit_bias: key \"42\": 1e400 is out of range"},
           {R"({"messages": [{"role": "user", "content": "x"}, {"a": [1, [2, 3e999]]}]})",
            "messages[1].a[1][1]: 3e999 is out of range"},
           {"{" + user + R"(, "x": 1)" + std::string(400, '0') + "}",
            "x: 1" + std::string(31, '0') + "... is out of range"},
           {"1e400", "body: 1e400 is out of range"}}) {
    SCOPED_TRACE(c.body.substr(0, 80));
    const std::string error = ErrorOf(ApiKind::kChat, c.body);
    EXPECT_THAT(error, ::testing::StartsWith(c.message));
  }
  // A fault before it stays what it was.
  EXPECT_EQ(ErrorOf(ApiKind::kChat, R"({"a": tru, "n": 1e400})"), "body: not valid JSON");
  EXPECT_EQ(ErrorOf(ApiKind::kChat, "{" + user + R"(, "n": 1e300})"),
            "n: expected an integer, got 1e+300");
}

}  // namespace
}  // namespace lazyattn::router
