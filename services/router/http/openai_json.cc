#include "services/router/http/openai_json.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "services/router/http/json_numbers.h"
#include "services/router/http/json_raw_checks.h"

namespace lazyattn::router {
namespace {

using lazyattn::v1::GenerateRequest;
using nlohmann::json;

// OpenAI's top_p at or below this keeps only the most likely token. The gRPC API reads top_p 0
// as "off", so such a top_p is sent as top_k 1 (top_p off): the same single token. The bound is
// exact: a nucleus of mass p <= 1e-8 is the top token alone in any vocabulary under 1e8 ids
// (the top token's probability is at least 1/vocab), and it keeps a tiny top_p from costing the
// sampler its rejection rounds.
constexpr double kGreedyTopP = 1e-8;

absl::Status Invalid(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
}

// A field absent or null is "not set", as OpenAI treats null.
const json* Field(const json& body, const char* name) {
  const auto it = body.find(name);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

absl::StatusOr<std::string> StringOf(const json& v, absl::string_view field) {
  if (!v.is_string()) return Invalid(field, absl::StrCat("expected a string, got ", v.type_name()));
  return v.get<std::string>();
}

absl::StatusOr<double> NumberOf(const json& v, absl::string_view field) {
  if (!v.is_number()) return Invalid(field, absl::StrCat("expected a number, got ", v.type_name()));
  const double d = v.get<double>();
  if (!std::isfinite(d)) return Invalid(field, "expected a finite number");
  return d;
}

absl::StatusOr<int64_t> IntegerOf(const json& v, absl::string_view field) {
  if (v.is_number_integer()) {
    if (v.is_number_unsigned() &&
        v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return Invalid(field, absl::StrCat("expected an integer from -9223372036854775808 to "
                                         "9223372036854775807 (a signed 64-bit integer), got ",
                                         v.dump()));
    }
    return v.get<int64_t>();
  }
  // 3.0 is an integer to JSON; 3.5 is not.
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e15) {
      return static_cast<int64_t>(d);
    }
  }
  // A number is short enough to quote; anything else only by its type (a hostile value may be
  // megabytes, and the message goes back to the client and into logs).
  return Invalid(field, absl::StrCat("expected an integer, got ",
                                     v.is_number() ? v.dump() : std::string(v.type_name())));
}

// A positive whole number too large for IntegerOf to read: an unsigned integer beyond int64
// (nlohmann keeps up to 2^64 - 1 exact) or a float from 9e15 on (every double that large is
// whole, but IntegerOf reads floats only below it, where they are exact).
bool TooLargeForIntegerOf(const json& v) {
  if (v.is_number_unsigned()) {
    return v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  }
  return v.is_number_float() && std::isfinite(v.get<double>()) && v.get<double>() >= 9.0e15;
}

// A float field: absent -> `fallback`.
absl::Status ReadFloat(const json& body, const char* name, float* out) {
  if (const json* v = Field(body, name)) {
    ASSIGN_OR_RETURN(const double d, NumberOf(*v, name));
    if (std::fabs(d) > 1e30) {
      return Invalid(name, absl::StrCat("expected a number within [-1e30, 1e30], got ", v->dump()));
    }
    *out = static_cast<float>(d);
  }
  return absl::OkStatus();
}

// Message content: a string, or a list of text parts (OpenAI's content-part form).
absl::StatusOr<std::string> ContentOf(const json& v, const std::string& field) {
  if (v.is_string()) return v.get<std::string>();
  if (!v.is_array()) {
    return Invalid(field,
                   absl::StrCat("expected a string or a list of text parts, got ", v.type_name()));
  }
  std::string text;
  for (size_t j = 0; j < v.size(); ++j) {
    const std::string part = absl::StrCat(field, "[", j, "]");
    const json& p = v[j];
    if (!p.is_object()) {
      return Invalid(part,
                     absl::StrCat("expected an object {\"type\": \"text\", \"text\": ...}, got ",
                                  p.type_name()));
    }
    const json* type = Field(p, "type");
    if (type == nullptr || !type->is_string() || type->get<std::string>() != "text") {
      return Invalid(part + ".type",
                     absl::StrCat("only text parts are supported, got ",
                                  type == nullptr ? "none" : QuoteForMessage(*type)));
    }
    const json* t = Field(p, "text");
    if (t == nullptr) return Invalid(part + ".text", "missing (a string)");
    ASSIGN_OR_RETURN(const std::string s, StringOf(*t, part + ".text"));
    text += s;
  }
  return text;
}

absl::Status ReadMessages(const json& body, GenerateRequest* r) {
  const json* messages = Field(body, "messages");
  if (messages == nullptr) return Invalid("messages", "missing (a list of chat messages)");
  if (!messages->is_array()) {
    return Invalid("messages", absl::StrCat("expected a list, got ", messages->type_name()));
  }
  if (messages->empty()) {
    return Invalid("messages", "expected at least one message, got an empty list");
  }
  for (size_t i = 0; i < messages->size(); ++i) {
    const std::string field = absl::StrCat("messages[", i, "]");
    const json& m = (*messages)[i];
    if (!m.is_object()) {
      return Invalid(field,
                     absl::StrCat("expected an object with role and content, got ", m.type_name()));
    }
    const json* role = Field(m, "role");
    if (role == nullptr) {
      return Invalid(field + ".role", "missing (system, developer, user or assistant)");
    }
    ASSIGN_OR_RETURN(std::string role_name, StringOf(*role, field + ".role"));
    if (role_name == "developer") role_name = "system";  // OpenAI's newer name for it
    if (role_name != "system" && role_name != "user" && role_name != "assistant") {
      return Invalid(field + ".role",
                     absl::StrCat("expected system, developer, user or assistant (tool and "
                                  "function messages are not supported), got ",
                                  QuoteForMessage(*role)));
    }
    std::string content;
    if (const json* c = Field(m, "content")) {
      ASSIGN_OR_RETURN(content, ContentOf(*c, field + ".content"));
    } else if (role_name != "assistant") {
      return Invalid(field + ".content", "missing (a string or a list of text parts)");
    }
    lazyattn::v1::ChatMessage* out = r->add_messages();
    out->set_role(std::move(role_name));
    out->set_content(std::move(content));
  }
  r->set_chat(true);
  return absl::OkStatus();
}

absl::Status ReadPrompt(const json& body, GenerateRequest* r) {
  const json* prompt = Field(body, "prompt");
  if (prompt == nullptr) return Invalid("prompt", "missing (a string)");
  if (prompt->is_array()) {
    if (prompt->size() != 1) {
      return Invalid("prompt", absl::StrCat("a list must hold exactly one string (batched prompts "
                                            "are not supported; send one request per prompt), got "
                                            "a list of ",
                                            prompt->size()));
    }
    ASSIGN_OR_RETURN(std::string text, StringOf((*prompt)[0], "prompt[0]"));
    r->set_question(std::move(text));
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(std::string text, StringOf(*prompt, "prompt"));
  r->set_question(std::move(text));
  return absl::OkStatus();
}

absl::Status ReadDocuments(const json& body, GenerateRequest* r) {
  const json* docs = Field(body, "documents");
  if (docs == nullptr) return absl::OkStatus();
  if (!docs->is_array()) {
    return Invalid("documents", absl::StrCat("expected a list, got ", docs->type_name()));
  }
  for (size_t i = 0; i < docs->size(); ++i) {
    const std::string field = absl::StrCat("documents[", i, "]");
    const json& d = (*docs)[i];
    if (!d.is_object()) {
      return Invalid(field, absl::StrCat("expected an object {\"id\": ..., \"text\": ...}, got ",
                                         d.type_name()));
    }
    lazyattn::v1::Document* out = r->add_documents();
    if (const json* id = Field(d, "id")) {
      ASSIGN_OR_RETURN(std::string s, StringOf(*id, field + ".id"));
      out->set_id(std::move(s));
    }
    const json* text = Field(d, "text");
    if (text == nullptr) return Invalid(field + ".text", "missing (a string)");
    ASSIGN_OR_RETURN(std::string s, StringOf(*text, field + ".text"));
    out->set_text(std::move(s));
  }
  return absl::OkStatus();
}

absl::Status ReadCacheMode(const json& body, GenerateRequest* r) {
  const json* mode = Field(body, "cache_mode");
  if (mode == nullptr) return absl::OkStatus();
  ASSIGN_OR_RETURN(const std::string name, StringOf(*mode, "cache_mode"));
  const std::string lower = absl::AsciiStrToLower(name);
  if (lower == "lazy") {
    r->set_cache_mode(lazyattn::v1::CACHE_MODE_LAZY);
  } else if (lower == "block") {
    r->set_cache_mode(lazyattn::v1::CACHE_MODE_BLOCK);
  } else if (lower == "prefix") {
    r->set_cache_mode(lazyattn::v1::CACHE_MODE_PREFIX);
  } else if (lower == "full") {
    r->set_cache_mode(lazyattn::v1::CACHE_MODE_FULL);
  } else {
    return Invalid("cache_mode", absl::StrCat("expected lazy, block, prefix or full, got ",
                                              QuoteForMessage(*mode)));
  }
  return absl::OkStatus();
}

// vLLM's cache_salt: a string; null or "" sets none (GenerateRequest.cache_salt).
absl::Status ReadCacheSalt(const json& body, GenerateRequest* r) {
  const json* salt = Field(body, "cache_salt");
  if (salt == nullptr) return absl::OkStatus();
  ASSIGN_OR_RETURN(std::string s, StringOf(*salt, "cache_salt"));
  r->set_cache_salt(std::move(s));
  return absl::OkStatus();
}

absl::Status ReadSampling(const json& body, OpenAiRequest* out) {
  lazyattn::v1::SamplingParams* s = out->request.mutable_sampling();
  // OpenAI samples at temperature 1 unless told otherwise (the gRPC API's default is greedy).
  s->set_temperature(1.0f);
  float f = 1.0f;
  RETURN_IF_ERROR(ReadFloat(body, "temperature", &f));
  s->set_temperature(f);
  f = 0.0f;  // absent: off
  RETURN_IF_ERROR(ReadFloat(body, "top_p", &f));
  s->set_top_p(f);
  // Negative values stay as sent: the shared validator refuses them, naming top_p.
  const bool greedy_top_p = Field(body, "top_p") != nullptr && f >= 0 && f <= kGreedyTopP;
  f = 0.0f;
  RETURN_IF_ERROR(ReadFloat(body, "presence_penalty", &f));
  s->set_presence_penalty(f);
  f = 0.0f;
  RETURN_IF_ERROR(ReadFloat(body, "frequency_penalty", &f));
  s->set_frequency_penalty(f);
  f = 0.0f;
  RETURN_IF_ERROR(ReadFloat(body, "min_p", &f));
  s->set_min_p(f);
  f = 0.0f;
  RETURN_IF_ERROR(ReadFloat(body, "repetition_penalty", &f));
  s->set_repetition_penalty(f);
  if (const json* v = Field(body, "top_k")) {
    ASSIGN_OR_RETURN(const int64_t k, IntegerOf(*v, "top_k"));
    if (k < 0 || k > std::numeric_limits<int32_t>::max()) {
      return Invalid("top_k", absl::StrCat("expected 0 to 2147483647, got ", k));
    }
    s->set_top_k(static_cast<int32_t>(k));
  }
  if (greedy_top_p) {  // after top_k: keeping one token overrides any larger top_k
    s->set_top_k(1);
    s->set_top_p(1.0f);
  }
  for (const char* name : {"max_tokens", "max_completion_tokens"}) {  // the second wins
    if (const json* v = Field(body, name)) {
      // Beyond int32 it goes as int32's max, over any limits.max_tokens: the shared validator
      // refuses it (with the router's limit in its message), and ToHttpFieldNames puts back the
      // value sent and the field it came in. So does a whole number beyond what IntegerOf reads
      // (18446744073709551615, 1e20): it is as much out of range, not of another type.
      constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
      std::string sent;
      int64_t n = kMax;
      if (TooLargeForIntegerOf(*v)) {
        sent = v->dump();
      } else {
        ASSIGN_OR_RETURN(n, IntegerOf(*v, name));
        if (n < 1) return Invalid(name, absl::StrCat("must be at least 1, got ", n));
        if (n > kMax) sent = absl::StrCat(n);
      }
      s->set_max_tokens(static_cast<int32_t>(std::min(n, kMax)));
      out->max_tokens_field = name;
      out->max_tokens_sent = std::move(sent);
    }
  }
  if (const json* v = Field(body, "seed")) {
    ASSIGN_OR_RETURN(const int64_t seed, IntegerOf(*v, "seed"));
    s->set_seed(static_cast<uint64_t>(seed));
  }
  if (const json* v = Field(body, "stop")) {
    if (v->is_string()) {
      s->add_stop(v->get<std::string>());
      out->stop_string = true;
    } else if (v->is_array()) {
      for (size_t i = 0; i < v->size(); ++i) {
        ASSIGN_OR_RETURN(std::string stop, StringOf((*v)[i], absl::StrCat("stop[", i, "]")));
        s->add_stop(std::move(stop));
      }
    } else {
      return Invalid("stop",
                     absl::StrCat("expected a string or a list of strings, got ", v->type_name()));
    }
  }
  return absl::OkStatus();
}

// A logit_bias key: a token id in canonical decimal (digits, '-' before a negative one, no '+',
// spaces or leading zeros), within int32. One spelling per id, so the keys of one JSON object
// never name a token twice, and a message naming "sampling.logit_bias[<id>]" names the very key
// the client wrote. Python's int(), which vLLM uses, also takes " 7", "+7" and "07".
bool TokenIdKey(absl::string_view key, int32_t* id) {
  absl::string_view digits = key;
  absl::ConsumePrefix(&digits, "-");
  if (digits.empty() || (digits[0] == '0' && key != "0")) return false;  // "", "-", "07", "-0"
  for (const char c : digits) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return false;
  }
  return absl::SimpleAtoi(key, id);  // false outside int32
}

// OpenAI's logit_bias, {"<token id>": bias}: the entries in key order (nlohmann's object sorts
// its keys; of a key written twice in the body, the parser keeps the last value). null and {} set
// none. The entry count, the ids' range and the biases' [-100, 100] are the shared validator's.
absl::Status ReadLogitBias(const json& body, GenerateRequest* r) {
  const json* bias = Field(body, "logit_bias");
  if (bias == nullptr) return absl::OkStatus();
  if (!bias->is_object()) {
    return Invalid("logit_bias", absl::StrCat("expected an object, got ", bias->type_name()));
  }
  auto* out = r->mutable_sampling()->mutable_logit_bias();
  for (auto it = bias->begin(); it != bias->end(); ++it) {
    int32_t id = 0;
    if (!TokenIdKey(it.key(), &id)) {
      return Invalid("logit_bias",
                     absl::StrCat("expected token ids as keys (decimal integers within 32 bits, "
                                  "no '+', spaces or leading zeros), got ",
                                  QuoteForMessage(json(it.key()))));
    }
    const std::string entry = absl::StrCat("logit_bias: key \"", it.key(), "\"");
    ASSIGN_OR_RETURN(const double d, NumberOf(*it, entry));
    if (std::fabs(d) > 1e30) {  // as ReadFloat: a double beyond float's range has no float value
      return Invalid(entry,
                     absl::StrCat("expected a number within [-1e30, 1e30], got ", it->dump()));
    }
    (*out)[id] = static_cast<float>(d);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<OpenAiRequest> ParseOpenAiRequest(ApiKind kind, std::string_view body_text) {
  RETURN_IF_ERROR(CheckRawJson(body_text, kMaxJsonDepth, kMaxJsonElements));
  // No parse callback: with one, parsing is quadratic (json_raw_checks.h bounds the depth).
  json body = json::parse(body_text.begin(), body_text.end(), /*cb=*/nullptr,
                          /*allow_exceptions=*/false);
  if (body.is_discarded()) {
    // nlohmann refuses a number beyond a double's range as a parse error: name it, as sent.
    if (const auto number = FindOutOfRangeNumber(body_text, kMaxJsonDepth)) {
      return Invalid(number->field, absl::StrCat(number->text,
                                                 " is out of range (a JSON number here must be "
                                                 "within a double's range, about 1.8e308)"));
    }
    return Invalid("body", "not valid JSON");
  }
  if (!body.is_object()) {
    return Invalid("body", absl::StrCat("expected a JSON object, got ", body.type_name()));
  }
  OpenAiRequest out;
  out.kind = kind;
  if (const json* model = Field(body, "model")) {
    ASSIGN_OR_RETURN(out.model, StringOf(*model, "model"));
    out.request.set_model(out.model);  // the router chooses the model's workers by it
  }
  // Before the fields read: a request asking for what the router does not do is refused as such,
  // not for a lesser fault elsewhere.
  RETURN_IF_ERROR(CheckUnsupportedFields(kind, body));
  out.unknown_fields = UnknownFields(kind, body);
  if (const json* n = Field(body, "n")) {
    ASSIGN_OR_RETURN(const int64_t choices, IntegerOf(*n, "n"));
    if (choices < 1 || choices > kMaxChoices) {
      return Invalid("n", absl::StrCat("expected 1 to ", kMaxChoices, ", got ", choices));
    }
    out.choices = static_cast<int>(choices);
  }
  if (const json* user = Field(body, "user")) {
    RETURN_IF_ERROR(StringOf(*user, "user").status());
  }
  if (const json* stream = Field(body, "stream")) {
    if (!stream->is_boolean()) {
      return Invalid("stream", absl::StrCat("expected true or false, got ", stream->type_name()));
    }
    out.stream = stream->get<bool>();
  }
  if (const json* options = Field(body, "stream_options")) {
    if (!options->is_object()) {
      return Invalid("stream_options",
                     absl::StrCat("expected an object, got ", options->type_name()));
    }
    if (const json* usage = Field(*options, "include_usage")) {
      if (!usage->is_boolean()) {
        return Invalid("stream_options.include_usage",
                       absl::StrCat("expected true or false, got ", usage->type_name()));
      }
      out.include_usage = usage->get<bool>();
    }
    // OpenAI answers 400 here, and so does vLLM (for any non-empty object): options of a stream
    // on a request that is not one say the client expects what it will not get.
    if (!out.stream && !options->empty()) {
      return Invalid("stream_options", "only allowed when stream is true");
    }
  }
  GenerateRequest& r = out.request;
  if (kind == ApiKind::kChat) {
    RETURN_IF_ERROR(ReadMessages(body, &r));
  } else {
    RETURN_IF_ERROR(ReadPrompt(body, &r));
    if (const json* echo = Field(body, "echo")) out.echo = echo->get<bool>();  // checked above
  }
  RETURN_IF_ERROR(ReadDocuments(body, &r));
  RETURN_IF_ERROR(ReadCacheMode(body, &r));
  RETURN_IF_ERROR(ReadCacheSalt(body, &r));
  RETURN_IF_ERROR(ReadSampling(body, &out));
  RETURN_IF_ERROR(ReadLogitBias(body, &r));
  ASSIGN_OR_RETURN(const LogprobsRequest logprobs, ReadLogprobs(kind, body));
  r.mutable_sampling()->set_logprobs(logprobs.logprobs);
  r.mutable_sampling()->set_top_logprobs(logprobs.top_logprobs);
  return out;
}

namespace {

// The gRPC API reads max_tokens 0 as "the worker's default", and its range starts at 0; the
// HTTP API refuses 0 (ReadSampling), so its messages say the range it takes.
std::string MaxTokensRangeForHttp(absl::string_view what) {
  return absl::StrReplaceAll(what, {{" outside [0, ", " outside [1, "}});
}

}  // namespace

std::string ToHttpFieldNames(const OpenAiRequest& request, std::string_view message) {
  const absl::string_view m(message.data(), message.size());
  // The request holds a string `stop` as a list of one: the field is `stop`, not its entry.
  constexpr absl::string_view kFirstStop = "sampling.stop[0]: ";
  if (request.stop_string && absl::StartsWith(m, kFirstStop)) {
    return absl::StrCat("stop: ", m.substr(kFirstStop.size()));
  }
  constexpr absl::string_view kMaxTokens = "sampling.max_tokens: ";
  if (!absl::StartsWith(m, kMaxTokens)) return ToHttpFieldNames(request.kind, message);
  absl::string_view what = m.substr(kMaxTokens.size());
  std::string value;
  if (!request.max_tokens_sent.empty()) {
    // The validator quotes the value it saw, int32's max for a larger one: quote the one sent.
    const std::string clamped = absl::StrCat(request.request.sampling().max_tokens());
    if (absl::ConsumePrefix(&what, clamped) &&
        (what.empty() || !absl::ascii_isdigit(static_cast<unsigned char>(what[0])))) {
      value = request.max_tokens_sent;
    } else {
      what = m.substr(kMaxTokens.size());
    }
  }
  return absl::StrCat(request.max_tokens_field, ": ", value, MaxTokensRangeForHttp(what));
}

std::string ToHttpFieldNames(ApiKind kind, std::string_view message) {
  const absl::string_view m(message.data(), message.size());
  // An entry of the map is named by its JSON key, and the field (`param`) is the map itself.
  constexpr absl::string_view kBiasEntry = "sampling.logit_bias[";
  if (absl::StartsWith(m, kBiasEntry)) {
    const size_t close = m.find("]: ", kBiasEntry.size());
    if (close != absl::string_view::npos) {
      return absl::StrCat("logit_bias: key \"",
                          m.substr(kBiasEntry.size(), close - kBiasEntry.size()),
                          "\": ", m.substr(close + 3));
    }
  }
  if (absl::StartsWith(m, "sampling.max_tokens: ")) {
    return absl::StrCat("max_tokens: ", MaxTokensRangeForHttp(m.substr(21)));
  }
  if (absl::StartsWith(m, "sampling.")) return std::string(m.substr(9));
  if (kind == ApiKind::kCompletion && absl::StartsWith(m, "question:")) {
    return absl::StrCat("prompt:", m.substr(9));
  }
  // The worker's whole prompt (system prefix, documents, question) is a chat request's messages,
  // its documents and the template's text: chat has no field `prompt`.
  if (kind == ApiKind::kChat && absl::StartsWith(m, "prompt: ")) {
    return absl::StrCat("messages: ", m.substr(8),
                        " (the prompt: the messages, the documents and the chat template)");
  }
  return std::string(m);
}

}  // namespace lazyattn::router
