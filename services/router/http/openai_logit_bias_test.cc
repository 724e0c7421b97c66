// OpenAI's logit_bias on the HTTP front: how its JSON keys and values become
// SamplingParams.logit_bias, what shapes are refused here, and how the shared validator's
// messages about it reach the client (param `logit_bias`, the key named).
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/request_validator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "services/router/http/error_mapping.h"
#include "services/router/http/openai_json.h"
#include "services/router/http/openai_json_test_util.h"

namespace lazyattn::router {
namespace {

using nlohmann::json;
using testing::ErrorOf;
using ::testing::IsEmpty;

// OpenAI's logit_bias on both endpoints: token ids written as JSON keys -> SamplingParams.
// logit_bias, integer and fractional biases alike; null and {} set none.
TEST(OpenAiJsonTest, LogitBiasMapsTokenIdsToBiases) {
  auto bias_of = [](ApiKind kind, const std::string& value) {
    const std::string head = kind == ApiKind::kChat
                                 ? R"("messages": [{"role": "user", "content": "x"}])"
                                 : R"("prompt": "x")";
    auto r = ParseOpenAiRequest(kind, "{" + head + R"(, "logit_bias": )" + value + "}");
    EXPECT_TRUE(r.ok()) << r.status();
    if (r.ok()) {
      EXPECT_THAT(r->unknown_fields, IsEmpty());
    }
    return r.ok() ? r->request.sampling().logit_bias() : google::protobuf::Map<int32_t, float>();
  };
  for (const ApiKind kind : {ApiKind::kChat, ApiKind::kCompletion}) {
    SCOPED_TRACE(kind == ApiKind::kChat ? "chat" : "completion");
    const auto two = bias_of(kind, R"({"50256": -100, "7": 2.5})");
    ASSERT_EQ(two.size(), 2u);
    EXPECT_EQ(two.at(50256), -100.0f);
    EXPECT_EQ(two.at(7), 2.5f);
    EXPECT_TRUE(bias_of(kind, "null").empty());
    EXPECT_TRUE(bias_of(kind, "{}").empty());
  }
  const auto edges =
      bias_of(ApiKind::kChat, R"({"0": 0, "100": 100.0, "2147483647": 1e-3, "-2147483648": -7})");
  ASSERT_EQ(edges.size(), 4u);
  EXPECT_EQ(edges.at(0), 0.0f);  // a bias of 0 is kept: it is what the client sent
  EXPECT_EQ(edges.at(100), 100.0f);
  EXPECT_FLOAT_EQ(edges.at(2147483647), 1e-3f);
  EXPECT_EQ(edges.at(-2147483648), -7.0f);  // the validator refuses a negative id, naming it
  // A key written twice: JSON leaves it open, nlohmann keeps the last value. One entry, no crash.
  const auto twice = bias_of(ApiKind::kChat, R"({"5": 1, "5": -3})");
  ASSERT_EQ(twice.size(), 1u);
  EXPECT_EQ(twice.at(5), -3.0f);
}

// A map that is not {"<token id>": number}: 400 naming logit_bias, and the key at fault.
TEST(OpenAiJsonTest, LogitBiasOfTheWrongShapeIsRefusedNamingLogitBias) {
  const std::string keys =
      "logit_bias: expected token ids as keys (decimal integers within 32 bits, no '+', spaces "
      "or leading zeros), got ";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"[1, 2]", "logit_bias: expected an object, got array"},
      {R"("50256")", "logit_bias: expected an object, got string"},
      {"5", "logit_bias: expected an object, got number"},
      {"true", "logit_bias: expected an object, got boolean"},
      {R"({"abc": 1})", keys + R"("abc")"},
      {R"({"1.5": 1})", keys + R"("1.5")"},
      {R"({"": 1})", keys + R"("")"},
      {R"({" 1": 1})", keys + R"(" 1")"},
      {R"({"1 ": 1})", keys + R"("1 ")"},
      {R"({"+1": 1})", keys + R"("+1")"},
      {R"({"01": 1})", keys + R"("01")"},
      {R"({"-0": 1})", keys + R"("-0")"},
      {R"({"-": 1})", keys + R"("-")"},
      {R"({"1e3": 1})", keys + R"("1e3")"},
      {R"({"0x10": 1})", keys + R"("0x10")"},
      {R"({"١": 1})", keys + "\"\u0661\""},  // ARABIC-INDIC DIGIT ONE
      {R"({"99999999999": 1})", keys + R"("99999999999")"},
      {R"({"2147483648": 1})", keys + R"("2147483648")"},
      {R"({"-2147483649": 1})", keys + R"("-2147483649")"},
      {"{\"" + std::string(100, '9') + "\": 1}", keys + "\"" + std::string(32, '9') + "...\""},
      // Keys are read in sorted order: the first bad one so named.
      {R"({"7": 1, "x": 1, "b": 1})", keys + R"("b")"},
      {R"({"7": "1"})", R"(logit_bias: key "7": expected a number, got string)"},
      {R"({"7": true})", R"(logit_bias: key "7": expected a number, got boolean)"},
      {R"({"7": null})", R"(logit_bias: key "7": expected a number, got null)"},
      {R"({"7": {}})", R"(logit_bias: key "7": expected a number, got object)"},
      {R"({"7": [1]})", R"(logit_bias: key "7": expected a number, got array)"},
      {R"({"7": 1e31})",
       R"(logit_bias: key "7": expected a number within [-1e30, 1e30], got 1e+31)"},
      {R"({"3": 1, "7": -1e300})",
       R"(logit_bias: key "7": expected a number within [-1e30, 1e30], got -1e+300)"},
  };
  for (const ApiKind kind : {ApiKind::kChat, ApiKind::kCompletion}) {
    const std::string head = kind == ApiKind::kChat
                                 ? R"("messages": [{"role": "user", "content": "x"}])"
                                 : R"("prompt": "x")";
    for (const auto& [value, want] : cases) {
      SCOPED_TRACE(value);
      const std::string message = ErrorOf(kind, "{" + head + R"(, "logit_bias": )" + value + "}");
      EXPECT_EQ(message, want);
      EXPECT_EQ(ParamOf(message), "logit_bias");
    }
  }
}

// The biases' range, the entry count and the ids' bounds are the shared validator's, so both APIs
// refuse the same requests; its messages reach the HTTP client naming logit_bias and the key.
TEST(OpenAiJsonTest, LogitBiasBoundsAreTheValidatorsNamingLogitBias) {
  auto validated = [](const std::string& bias) {
    auto r = ParseOpenAiRequest(
        ApiKind::kChat,
        R"({"messages": [{"role": "user", "content": "x"}], "logit_bias": )" + bias + "}");
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return std::string(r.status().message());
    const absl::Status s = ValidateGenerateRequest(r->request, ApiLimits(), /*vocab_size=*/1000);
    return s.ok() ? std::string("ok") : ToHttpFieldNames(ApiKind::kChat, std::string(s.message()));
  };
  EXPECT_EQ(validated(R"({"0": -100, "999": 100, "5": 0.5})"), "ok");
  std::string many = "{";
  for (int i = 0; i <= ApiLimits().max_logit_bias; ++i) {
    absl::StrAppend(&many, i == 0 ? "" : ", ", "\"", i, "\": 1");
  }
  many += "}";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"7": 101})", R"(logit_bias: key "7": bias 101 outside [-100, 100])"},
      {R"({"7": -100.5})", R"(logit_bias: key "7": bias -100.5 outside [-100, 100])"},
      {R"({"1000": 1})",
       R"(logit_bias: key "1000": token id 1000 outside the vocabulary (size 1000))"},
      {R"({"-3": 1})", R"(logit_bias: key "-3": negative token id -3)"},
      {many, absl::StrCat("logit_bias: ", ApiLimits().max_logit_bias + 1, " entries, the limit is ",
                          ApiLimits().max_logit_bias, " (limits.max_logit_bias)")},
  };
  for (const auto& [bias, want] : cases) {
    SCOPED_TRACE(bias.substr(0, 40));
    const std::string message = validated(bias);
    EXPECT_EQ(message, want);
    EXPECT_EQ(ParamOf(message), "logit_bias");
  }
}

}  // namespace
}  // namespace lazyattn::router
