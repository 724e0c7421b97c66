#include "common/request_validator.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "common/utf8.h"
#include "kernels/include/sampling.h"

namespace lazyattn {
namespace {

using v1::Document;

// Carries the label of a field whose text is not UTF-8 (for the caller's metric); dropped when
// the status becomes a grpc::Status.
constexpr char kUtf8PayloadUrl[] = "type.lazyattn.dev/lazyattn.InvalidUtf8Field";

absl::Status Invalid(const std::string& field, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
}

// The shortest text that reads back as `value` (std::to_chars): a float just past a bound
// (top_p 1.0000001, a bias of 100.00001 from JSON) must not print as the bound itself, which
// StrCat's six significant digits do.
std::string FloatText(float value) {
  char text[32];
  const std::to_chars_result r = std::to_chars(text, text + sizeof(text), value);
  return std::string(text, r.ptr);
}

// `label` is the field's entry in kTextFieldLabels; `field` its full name with indices.
absl::Status CheckText(const std::string& field, const char* label, std::string_view text,
                       int64_t max_bytes) {
  if (static_cast<int64_t>(text.size()) > max_bytes) {
    return Invalid(field, absl::StrCat(text.size(), " bytes, the limit is ", max_bytes));
  }
  const size_t bad = FirstInvalidUtf8Byte(text);
  if (bad != std::string_view::npos) {
    absl::Status s = Invalid(
        field, absl::StrCat("not valid UTF-8 (byte ", bad, " of ", text.size(), ", value 0x",
                            absl::Hex(static_cast<unsigned char>(text[bad]), absl::kZeroPad2),
                            ")"));
    s.SetPayload(kUtf8PayloadUrl, absl::Cord(label));
    return s;
  }
  return absl::OkStatus();
}

absl::Status CheckTokenId(const std::string& field, int64_t id, int64_t vocab_size) {
  if (id < 0) return Invalid(field, absl::StrCat("negative token id ", id));
  if (vocab_size > 0 && id >= vocab_size) {
    return Invalid(
        field, absl::StrCat("token id ", id, " outside the vocabulary (size ", vocab_size, ")"));
  }
  return absl::OkStatus();
}

absl::Status ValidateDocuments(const google::protobuf::RepeatedPtrField<Document>& documents,
                               const ApiLimits& limits, int64_t vocab_size) {
  if (documents.size() > limits.max_documents) {
    return Invalid("documents", absl::StrCat(documents.size(), " documents, the limit is ",
                                             limits.max_documents));
  }
  for (int i = 0; i < documents.size(); ++i) {
    const Document& doc = documents[i];
    const std::string field = absl::StrCat("documents[", i, "]");
    RETURN_IF_ERROR(
        CheckText(field + ".id", "documents.id", doc.id(), limits.max_document_id_bytes));
    switch (doc.content_case()) {
      case Document::kText:
        if (doc.text().empty()) return Invalid(field + ".text", "empty document");
        RETURN_IF_ERROR(CheckText(field + ".text", "documents.text", doc.text(),
                                  limits.max_document_bytes));
        break;
      case Document::kTokens: {
        const auto& ids = doc.tokens().ids();
        if (ids.empty()) return Invalid(field + ".tokens", "empty document");
        if (ids.size() > limits.max_document_tokens) {
          return Invalid(field + ".tokens", absl::StrCat(ids.size(), " tokens, the limit is ",
                                                         limits.max_document_tokens));
        }
        for (int j = 0; j < ids.size(); ++j) {
          RETURN_IF_ERROR(
              CheckTokenId(absl::StrCat(field, ".tokens.ids[", j, "]"), ids[j], vocab_size));
        }
        break;
      }
      case Document::CONTENT_NOT_SET:
        return Invalid(field, "neither text nor tokens set");
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateMessages(const v1::GenerateRequest& r, const ApiLimits& limits) {
  const auto& messages = r.messages();
  if (messages.size() > limits.max_messages) {
    return Invalid("messages", absl::StrCat(messages.size(), " messages, the limit is ",
                                            limits.max_messages));
  }
  if (!r.system().empty()) {
    return Invalid("system", "must be empty with messages (send a system message instead)");
  }
  if (!r.question().empty()) {
    return Invalid("question", "must be empty with messages (the last user message is the question)");
  }
  for (int i = 0; i < messages.size(); ++i) {
    const v1::ChatMessage& m = messages[i];
    const std::string field = absl::StrCat("messages[", i, "]");
    if (m.role() == "system") {
      if (i != 0) return Invalid(field + ".role", "a system message must be the first message");
    } else if (m.role() != "user" && m.role() != "assistant") {
      // The role is not echoed: it may not be UTF-8.
      return Invalid(field + ".role", "expected system, user or assistant");
    }
    RETURN_IF_ERROR(CheckText(field + ".content", "messages.content", m.content(),
                              limits.max_question_bytes));
  }
  if (messages[messages.size() - 1].role() != "user") {
    return Invalid(absl::StrCat("messages[", messages.size() - 1, "].role"),
                   "the last message must be a user turn (generation answers it)");
  }
  return absl::OkStatus();
}

absl::Status ValidateSampling(const v1::SamplingParams& p, const ApiLimits& limits,
                              int64_t vocab_size) {
  if (!std::isfinite(p.temperature()) || p.temperature() < 0 || p.temperature() > 100) {
    return Invalid("sampling.temperature",
                   absl::StrCat(FloatText(p.temperature()), " outside [0, 100]"));
  }
  if (p.top_k() < 0) return Invalid("sampling.top_k", absl::StrCat(p.top_k(), " is negative"));
  if (!std::isfinite(p.top_p()) || p.top_p() < 0 || p.top_p() > 1) {
    return Invalid("sampling.top_p", absl::StrCat(FloatText(p.top_p()), " outside [0, 1]"));
  }
  if (!std::isfinite(p.min_p()) || p.min_p() < 0 || p.min_p() > 1) {
    return Invalid("sampling.min_p", absl::StrCat(FloatText(p.min_p()), " outside [0, 1]"));
  }
  if (!std::isfinite(p.repetition_penalty()) || p.repetition_penalty() < 0 ||
      p.repetition_penalty() > 100) {
    return Invalid("sampling.repetition_penalty", absl::StrCat(FloatText(p.repetition_penalty()),
                                                               " outside [0, 100] (0 or 1: off)"));
  }
  if (!std::isfinite(p.presence_penalty()) || std::fabs(p.presence_penalty()) > 2) {
    return Invalid("sampling.presence_penalty",
                   absl::StrCat(FloatText(p.presence_penalty()), " outside [-2, 2]"));
  }
  if (!std::isfinite(p.frequency_penalty()) || std::fabs(p.frequency_penalty()) > 2) {
    return Invalid("sampling.frequency_penalty",
                   absl::StrCat(FloatText(p.frequency_penalty()), " outside [-2, 2]"));
  }
  if (p.max_tokens() < 0 || p.max_tokens() > limits.max_tokens) {
    return Invalid("sampling.max_tokens",
                   absl::StrCat(p.max_tokens(), " outside [0, ", limits.max_tokens, "]"));
  }
  if (p.stop_size() > limits.max_stop_strings) {
    return Invalid("sampling.stop", absl::StrCat(p.stop_size(), " stop strings, the limit is ",
                                                 limits.max_stop_strings));
  }
  for (int i = 0; i < p.stop_size(); ++i) {
    const std::string field = absl::StrCat("sampling.stop[", i, "]");
    if (p.stop(i).empty()) return Invalid(field, "empty stop string");
    RETURN_IF_ERROR(CheckText(field, "sampling.stop", p.stop(i), limits.max_stop_bytes));
  }
  if (p.stop_token_ids_size() > limits.max_stop_token_ids) {
    return Invalid(
        "sampling.stop_token_ids",
        absl::StrCat(p.stop_token_ids_size(), " ids, the limit is ", limits.max_stop_token_ids));
  }
  for (int i = 0; i < p.stop_token_ids_size(); ++i) {
    RETURN_IF_ERROR(CheckTokenId(absl::StrCat("sampling.stop_token_ids[", i, "]"),
                                 p.stop_token_ids(i), vocab_size));
  }
  if (p.logit_bias_size() > limits.max_logit_bias) {
    return Invalid("sampling.logit_bias",
                   absl::StrCat(p.logit_bias_size(), " entries, the limit is ",
                                limits.max_logit_bias, " (limits.max_logit_bias)"));
  }
  // A map's order is unspecified: the entries are checked in id order, so a request with several
  // bad entries is always refused with the same message.
  std::vector<std::pair<int32_t, float>> biases(p.logit_bias().begin(), p.logit_bias().end());
  std::sort(biases.begin(), biases.end());
  for (const auto& [id, bias] : biases) {
    const std::string field = absl::StrCat("sampling.logit_bias[", id, "]");
    RETURN_IF_ERROR(CheckTokenId(field, id, vocab_size));
    if (!std::isfinite(bias) || std::fabs(bias) > kMaxLogitBias) {
      return Invalid(field, absl::StrFormat("bias %s outside [-%g, %g]", FloatText(bias),
                                            kMaxLogitBias, kMaxLogitBias));
    }
  }
  if (p.top_logprobs() < 0 || p.top_logprobs() > kMaxTopLogprobs) {
    return Invalid("sampling.top_logprobs",
                   absl::StrCat(p.top_logprobs(), " outside [0, ", kMaxTopLogprobs, "]"));
  }
  if (p.top_logprobs() > 0 && !p.logprobs()) {
    return Invalid(
        "sampling.top_logprobs",
        absl::StrCat(p.top_logprobs(), " needs sampling.logprobs (the chosen tokens' own)"));
  }
  return absl::OkStatus();
}

absl::Status CheckCacheSalt(const std::string& salt) {
  if (static_cast<int64_t>(salt.size()) <= kMaxCacheSaltBytes) return absl::OkStatus();
  return Invalid("cache_salt",
                 absl::StrCat(salt.size(), " bytes, the limit is ", kMaxCacheSaltBytes));
}

}  // namespace

absl::Status ValidateGenerateRequest(const v1::GenerateRequest& r, const ApiLimits& limits,
                                     int64_t vocab_size) {
  RETURN_IF_ERROR(CheckText("system", "system", r.system(), limits.max_system_bytes));
  RETURN_IF_ERROR(ValidateDocuments(r.documents(), limits, vocab_size));
  if (!r.messages().empty()) {
    RETURN_IF_ERROR(ValidateMessages(r, limits));
  } else if (r.question().empty()) {
    // With documents too: generation starts from the question's last token (a cached
    // document's last token has no logits in a step), so every worker would refuse it.
    return Invalid("question", "must not be empty (generation starts after it)");
  }
  RETURN_IF_ERROR(CheckText("question", "question", r.question(), limits.max_question_bytes));
  RETURN_IF_ERROR(ValidateSampling(r.sampling(), limits, vocab_size));
  if (!v1::CacheMode_IsValid(r.cache_mode())) {
    return Invalid("cache_mode", absl::StrCat("unknown cache mode ", r.cache_mode()));
  }
  return CheckCacheSalt(r.cache_salt());
}

absl::Status ValidatePrefetchRequest(const v1::PrefetchRequest& r, const ApiLimits& limits,
                                     int64_t vocab_size) {
  if (r.documents().empty()) return Invalid("documents", "no documents to prefetch");
  RETURN_IF_ERROR(ValidateDocuments(r.documents(), limits, vocab_size));
  if (r.cache_mode() != v1::CACHE_MODE_UNSPECIFIED && r.cache_mode() != v1::CACHE_MODE_LAZY &&
      r.cache_mode() != v1::CACHE_MODE_BLOCK) {
    return Invalid("cache_mode", absl::StrCat("prefetch takes LAZY or BLOCK, got ",
                                              v1::CacheMode_IsValid(r.cache_mode())
                                                  ? v1::CacheMode_Name(r.cache_mode())
                                                  : absl::StrCat(r.cache_mode())));
  }
  if (r.replicas() < 0 || r.replicas() > limits.max_prefetch_replicas) {
    return Invalid("replicas",
                   absl::StrCat(r.replicas(), " outside [0, ", limits.max_prefetch_replicas, "]"));
  }
  return CheckCacheSalt(r.cache_salt());
}

std::optional<std::string> InvalidUtf8FieldLabel(const absl::Status& status) {
  if (!absl::IsInvalidArgument(status)) return std::nullopt;
  const auto label = status.GetPayload(kUtf8PayloadUrl);  // absl::optional here
  if (!label.has_value()) return std::nullopt;
  return std::string(*label);
}

absl::StatusOr<ApiLimits> ApiLimitsFromYaml(const YamlConfig& config, const ApiLimits& defaults) {
  constexpr int64_t kMaxInt = std::numeric_limits<int32_t>::max();
  ApiLimits l = defaults;
  ASSIGN_OR_RETURN(const int64_t max_documents,
                   config.IntIn("limits.max_documents", l.max_documents, 1, 100000));
  l.max_documents = static_cast<int>(max_documents);
  ASSIGN_OR_RETURN(l.max_document_bytes,
                   config.IntIn("limits.max_document_bytes", l.max_document_bytes, 1, kMaxInt));
  ASSIGN_OR_RETURN(l.max_document_tokens,
                   config.IntIn("limits.max_document_tokens", l.max_document_tokens, 1, kMaxInt));
  ASSIGN_OR_RETURN(l.max_document_id_bytes, config.IntIn("limits.max_document_id_bytes",
                                                         l.max_document_id_bytes, 0, 1 << 20));
  ASSIGN_OR_RETURN(l.max_system_bytes,
                   config.IntIn("limits.max_system_bytes", l.max_system_bytes, 0, kMaxInt));
  ASSIGN_OR_RETURN(l.max_question_bytes,
                   config.IntIn("limits.max_question_bytes", l.max_question_bytes, 0, kMaxInt));
  ASSIGN_OR_RETURN(const int64_t max_messages,
                   config.IntIn("limits.max_messages", l.max_messages, 1, 1 << 20));
  l.max_messages = static_cast<int>(max_messages);
  ASSIGN_OR_RETURN(const int64_t max_tokens,
                   config.IntIn("limits.max_tokens", l.max_tokens, 1, 1 << 24));
  l.max_tokens = static_cast<int>(max_tokens);
  // At most 16: the worker's engine refuses more (its ValidateSamplingParams), so a larger limit
  // would let requests pass this check only to fail in the engine.
  ASSIGN_OR_RETURN(const int64_t stops,
                   config.IntIn("limits.max_stop_strings", l.max_stop_strings, 0, 16));
  l.max_stop_strings = static_cast<int>(stops);
  ASSIGN_OR_RETURN(l.max_stop_bytes,
                   config.IntIn("limits.max_stop_bytes", l.max_stop_bytes, 1, 1 << 20));
  ASSIGN_OR_RETURN(const int64_t stop_ids,
                   config.IntIn("limits.max_stop_token_ids", l.max_stop_token_ids, 0, 1 << 16));
  l.max_stop_token_ids = static_cast<int>(stop_ids);
  ASSIGN_OR_RETURN(const int64_t biases,
                   config.IntIn("limits.max_logit_bias", l.max_logit_bias, 0, 1 << 16));
  l.max_logit_bias = static_cast<int>(biases);
  ASSIGN_OR_RETURN(const int64_t replicas,
                   config.IntIn("limits.max_prefetch_replicas", l.max_prefetch_replicas, 1, 10000));
  l.max_prefetch_replicas = static_cast<int>(replicas);
  return l;
}

}  // namespace lazyattn
