#include "services/router/http/openai_fields.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <set>
#include <string>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace lazyattn::router {
namespace {

using nlohmann::json;

// Each refusal says what is missing rather than only "not supported".
constexpr char kNoTools[] = "tool calling is not supported";
constexpr char kNoGuidance[] = "output is not constrained";

absl::Status Invalid(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
}

absl::Status NotSupported(absl::string_view field, absl::string_view why, const json& got) {
  return Invalid(field, absl::StrCat("not supported (", why, "), got ", QuoteForMessage(got)));
}

// A number is quoted as sent (1e20 is whole but beyond any count, 2.5 is not whole: the type alone
// would not say which), as IntegerOf quotes `n` and `max_tokens`; anything else by its type.
absl::Status WrongType(absl::string_view field, absl::string_view expected, const json& got) {
  return Invalid(field, absl::StrCat("expected ", expected, ", got ",
                                     got.is_number() ? got.dump() : std::string(got.type_name())));
}

// A field absent or null is "not set", as OpenAI treats null.
const json* Field(const json& body, const char* name) {
  const auto it = body.find(name);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

// The value is a whole number (3 and 3.0 alike); `*n` is it.
bool WholeNumber(const json& v, double* n) {
  if (!v.is_number()) return false;
  *n = v.get<double>();
  return std::fabs(*n) < 9.0e15 && *n == std::floor(*n);
}

// A count of alternatives: a whole number in [0, kMaxTopLogprobs].
absl::StatusOr<int> AlternativesCount(absl::string_view field, const json& v) {
  double n = 0;
  if (!WholeNumber(v, &n)) return WrongType(field, "an integer", v);
  if (n < 0 || n > kMaxTopLogprobs) {
    return Invalid(field, absl::StrCat("expected an integer in [0, ", kMaxTopLogprobs, "], got ",
                                       QuoteForMessage(v)));
  }
  return static_cast<int>(n);
}

absl::Status CheckCompletionOptions(ApiKind kind, const json& body) {
  if (const json* v = Field(body, "echo")) {
    if (!v->is_boolean()) return WrongType("echo", "true or false", *v);
    // vLLM's chat echo (the last message put before the answer) is not done.
    if (kind == ApiKind::kChat && v->get<bool>()) {
      return NotSupported("echo", "chat messages are not echoed", *v);
    }
    // The prompt's own log probabilities (OpenAI gives them with echo) are not computed: an
    // answer without them would mean something else than the client asked for.
    const json* logprobs = Field(body, "logprobs");
    if (v->get<bool>() && logprobs != nullptr && !logprobs->is_null()) {
      return NotSupported("echo", "with logprobs: the prompt's log probabilities are not computed",
                          *v);
    }
  }
  if (const json* v = Field(body, "best_of")) {
    // best_of candidates, the n most likely returned: the same as `n` alone when they are equal.
    double best = 0;
    if (!WholeNumber(*v, &best)) return WrongType("best_of", "an integer", *v);
    double choices = 1;
    const json* n = Field(body, "n");
    const bool n_valid =
        n == nullptr || (WholeNumber(*n, &choices) && choices >= 1 && choices <= kMaxChoices);
    if (!n_valid) {
      // `n` is refused when it is read; best_of is not held against it.
      if (best < 1) return Invalid("best_of", absl::StrCat("must be at least 1, got ", v->dump()));
    } else if (best < choices) {
      return Invalid("best_of",
                     absl::StrCat("must be at least n (", choices, "), got ", v->dump()));
    } else if (best > choices) {
      return NotSupported("best_of", "candidates are not ranked; only best_of equal to n", *v);
    }
  }
  if (const json* v = Field(body, "suffix")) {
    if (!v->is_string()) return WrongType("suffix", "a string", *v);
    if (!v->get<std::string>().empty()) {
      return NotSupported("suffix", "no text is inserted after the completion", *v);
    }
  }
  return absl::OkStatus();
}

absl::Status CheckTools(const json& body) {
  for (const char* name : {"tools", "functions"}) {
    if (const json* v = Field(body, name)) {
      if (!v->is_array()) return WrongType(name, "a list", *v);
      if (!v->empty()) {
        return Invalid(name,
                       absl::StrCat("not supported (", kNoTools, "), got a list of ", v->size()));
      }
    }
  }
  // "none" and "auto" without tools ask for no tool call: the answer is the same.
  for (const char* name : {"tool_choice", "function_call"}) {
    if (const json* v = Field(body, name)) {
      if (v->is_string() && (v->get<std::string>() == "none" || v->get<std::string>() == "auto")) {
        continue;
      }
      return NotSupported(name, absl::StrCat(kNoTools, "; only \"none\" or \"auto\""), *v);
    }
  }
  return absl::OkStatus();
}

absl::Status CheckOutputForm(const json& body) {
  if (const json* v = Field(body, "response_format")) {
    if (!v->is_object()) return WrongType("response_format", "an object", *v);
    const json* type = Field(*v, "type");
    if (type == nullptr || !type->is_string()) {
      return Invalid("response_format",
                     absl::StrCat("expected {\"type\": \"text\"}, got type ",
                                  type == nullptr ? "missing" : type->type_name()));
    }
    if (type->get<std::string>() != "text") {
      return NotSupported("response_format",
                          absl::StrCat(kNoGuidance, "; only {\"type\": \"text\"}"), *type);
    }
  }
  if (const json* v = Field(body, "modalities")) {
    if (!v->is_array()) return WrongType("modalities", "a list", *v);
    for (const json& m : *v) {
      if (!m.is_string() || m.get<std::string>() != "text") {
        return NotSupported("modalities", "the router answers in text only", m);
      }
    }
  }
  if (const json* v = Field(body, "audio")) {
    return NotSupported("audio", "the router answers in text only", *v);
  }
  for (const char* name : {"guided_json", "guided_regex", "guided_choice", "guided_grammar"}) {
    if (const json* v = Field(body, name)) return NotSupported(name, kNoGuidance, *v);
  }
  return absl::OkStatus();
}

// Every field ParseOpenAiRequest reads (both kinds but for messages / prompt), ignores knowingly,
// or checks above.
const std::set<std::string_view>& KnownFields() {
  static const auto* known = new std::set<std::string_view>{
      // read
      "model", "max_tokens", "max_completion_tokens", "temperature", "top_p", "seed", "stop", "n",
      "presence_penalty", "frequency_penalty", "stream", "stream_options", "documents",
      "cache_mode", "top_k", "min_p", "repetition_penalty", "logprobs", "top_logprobs",
      "logit_bias", "cache_salt",
      // ignored: harmless
      "user", "metadata", "store", "service_tier", "parallel_tool_calls", "prediction",
      // refused unless unset or default
      "echo", "best_of", "suffix", "tools", "functions", "tool_choice", "function_call",
      "response_format", "modalities", "audio", "guided_json", "guided_regex", "guided_choice",
      "guided_grammar"};
  return *known;
}

}  // namespace

std::string TruncateUtf8(const std::string& s, size_t max_bytes) {
  if (s.size() <= max_bytes) return s;
  size_t end = max_bytes;
  // Back off over continuation bytes (10xxxxxx) to the start of the character that was cut.
  while (end > 0 && (static_cast<unsigned char>(s[end]) & 0xC0) == 0x80) --end;
  return s.substr(0, end) + "...";
}

std::string QuoteForMessage(const json& value) {
  if (value.is_string()) {
    return json(TruncateUtf8(value.get<std::string>(), kQuotedBytes))
        .dump(-1, ' ', false, json::error_handler_t::replace);
  }
  if (value.is_number() || value.is_boolean() || value.is_null()) return value.dump();
  return value.type_name();
}

absl::StatusOr<LogprobsRequest> ReadLogprobs(ApiKind kind, const json& body) {
  LogprobsRequest asked;
  const json* logprobs = Field(body, "logprobs");
  const json* top = Field(body, "top_logprobs");
  if (kind == ApiKind::kCompletion) {
    if (logprobs != nullptr) {
      // A completion's logprobs counts alternatives; 0 still asks for the chosen tokens' own.
      ASSIGN_OR_RETURN(asked.top_logprobs, AlternativesCount("logprobs", *logprobs));
      asked.logprobs = true;
    }
    if (top != nullptr) {
      ASSIGN_OR_RETURN(const int n, AlternativesCount("top_logprobs", *top));
      if (n > 0) {
        return NotSupported("top_logprobs", "a completion counts its alternatives in logprobs: n",
                            *top);
      }
    }
    return asked;
  }
  if (logprobs != nullptr) {
    if (!logprobs->is_boolean()) return WrongType("logprobs", "true or false", *logprobs);
    asked.logprobs = logprobs->get<bool>();
  }
  if (top != nullptr) {
    ASSIGN_OR_RETURN(asked.top_logprobs, AlternativesCount("top_logprobs", *top));
    // As OpenAI: the alternatives come beside the chosen token's own, which must be asked for.
    if (asked.top_logprobs > 0 && !asked.logprobs) {
      return Invalid(
          "top_logprobs",
          absl::StrCat("needs logprobs: true, got ", QuoteForMessage(*top), " with logprobs ",
                       logprobs == nullptr ? "unset" : QuoteForMessage(*logprobs)));
    }
  }
  return asked;
}

absl::Status CheckUnsupportedFields(ApiKind kind, const json& body) {
  if (absl::Status s = ReadLogprobs(kind, body).status(); !s.ok()) return s;
  if (absl::Status s = CheckCompletionOptions(kind, body); !s.ok()) return s;
  if (absl::Status s = CheckTools(body); !s.ok()) return s;
  return CheckOutputForm(body);
}

std::vector<std::string> UnknownFields(ApiKind kind, const json& body) {
  std::vector<std::string> unknown;
  const char* own = kind == ApiKind::kChat ? "messages" : "prompt";
  for (auto it = body.begin(); it != body.end() && unknown.size() < kMaxUnknownFields; ++it) {
    if (it.key() == own || KnownFields().count(it.key()) > 0) continue;
    unknown.push_back(TruncateUtf8(it.key(), kMaxFieldNameBytes));
  }
  return unknown;
}

}  // namespace lazyattn::router
