#include "services/router/server/request_validator.h"

#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"

namespace lazyattn::router {
namespace {

using lazyattn::v1::Document;

absl::Status Invalid(const std::string& field, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
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
                               const RequestLimits& limits, int64_t vocab_size) {
  if (documents.size() > limits.max_documents) {
    return Invalid("documents", absl::StrCat(documents.size(), " documents, the limit is ",
                                             limits.max_documents));
  }
  for (int i = 0; i < documents.size(); ++i) {
    const Document& doc = documents[i];
    const std::string field = absl::StrCat("documents[", i, "]");
    if (static_cast<int64_t>(doc.id().size()) > limits.max_document_id_bytes) {
      return Invalid(field + ".id", absl::StrCat(doc.id().size(), " bytes, the limit is ",
                                                 limits.max_document_id_bytes));
    }
    switch (doc.content_case()) {
      case Document::kText:
        if (doc.text().empty()) return Invalid(field + ".text", "empty document");
        if (static_cast<int64_t>(doc.text().size()) > limits.max_document_bytes) {
          return Invalid(field + ".text", absl::StrCat(doc.text().size(), " bytes, the limit is ",
                                                       limits.max_document_bytes));
        }
        break;
      case Document::kTokens: {
        const auto& ids = doc.tokens().ids();
        if (ids.empty()) return Invalid(field + ".tokens", "empty document");
        if (ids.size() > limits.max_document_tokens) {
          return Invalid(field + ".tokens", absl::StrCat(ids.size(), " tokens, the limit is ",
                                                         limits.max_document_tokens));
        }
        for (int j = 0; j < ids.size(); ++j) {
          absl::Status s =
              CheckTokenId(absl::StrCat(field, ".tokens.ids[", j, "]"), ids[j], vocab_size);
          if (!s.ok()) return s;
        }
        break;
      }
      case Document::CONTENT_NOT_SET:
        return Invalid(field, "neither text nor tokens set");
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateSampling(const lazyattn::v1::SamplingParams& p, const RequestLimits& limits,
                              int64_t vocab_size) {
  if (!std::isfinite(p.temperature()) || p.temperature() < 0 || p.temperature() > 100) {
    return Invalid("sampling.temperature", absl::StrCat(p.temperature(), " outside [0, 100]"));
  }
  if (p.top_k() < 0) return Invalid("sampling.top_k", absl::StrCat(p.top_k(), " is negative"));
  if (!std::isfinite(p.top_p()) || p.top_p() < 0 || p.top_p() > 1) {
    return Invalid("sampling.top_p", absl::StrCat(p.top_p(), " outside [0, 1]"));
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
    if (static_cast<int64_t>(p.stop(i).size()) > limits.max_stop_bytes) {
      return Invalid(
          field, absl::StrCat(p.stop(i).size(), " bytes, the limit is ", limits.max_stop_bytes));
    }
  }
  if (p.stop_token_ids_size() > limits.max_stop_token_ids) {
    return Invalid(
        "sampling.stop_token_ids",
        absl::StrCat(p.stop_token_ids_size(), " ids, the limit is ", limits.max_stop_token_ids));
  }
  for (int i = 0; i < p.stop_token_ids_size(); ++i) {
    absl::Status s = CheckTokenId(absl::StrCat("sampling.stop_token_ids[", i, "]"),
                                  p.stop_token_ids(i), vocab_size);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateGenerateRequest(const lazyattn::v1::GenerateRequest& r,
                                     const RequestLimits& limits, int64_t vocab_size) {
  if (static_cast<int64_t>(r.system().size()) > limits.max_system_bytes) {
    return Invalid("system", absl::StrCat(r.system().size(), " bytes, the limit is ",
                                          limits.max_system_bytes));
  }
  absl::Status s = ValidateDocuments(r.documents(), limits, vocab_size);
  if (!s.ok()) return s;
  if (r.question().empty() && r.documents().empty()) {
    return Invalid("question", "empty question and no documents");
  }
  if (static_cast<int64_t>(r.question().size()) > limits.max_question_bytes) {
    return Invalid("question", absl::StrCat(r.question().size(), " bytes, the limit is ",
                                            limits.max_question_bytes));
  }
  s = ValidateSampling(r.sampling(), limits, vocab_size);
  if (!s.ok()) return s;
  if (!lazyattn::v1::CacheMode_IsValid(r.cache_mode())) {
    return Invalid("cache_mode", absl::StrCat("unknown cache mode ", r.cache_mode()));
  }
  return absl::OkStatus();
}

absl::Status ValidatePrefetchRequest(const lazyattn::v1::PrefetchRequest& r,
                                     const RequestLimits& limits, int64_t vocab_size) {
  if (r.documents().empty()) return Invalid("documents", "no documents to prefetch");
  absl::Status s = ValidateDocuments(r.documents(), limits, vocab_size);
  if (!s.ok()) return s;
  if (r.cache_mode() != lazyattn::v1::CACHE_MODE_UNSPECIFIED &&
      r.cache_mode() != lazyattn::v1::CACHE_MODE_LAZY &&
      r.cache_mode() != lazyattn::v1::CACHE_MODE_BLOCK) {
    return Invalid("cache_mode", absl::StrCat("prefetch takes LAZY or BLOCK, got ",
                                              lazyattn::v1::CacheMode_IsValid(r.cache_mode())
                                                  ? lazyattn::v1::CacheMode_Name(r.cache_mode())
                                                  : absl::StrCat(r.cache_mode())));
  }
  if (r.replicas() < 0 || r.replicas() > limits.max_prefetch_replicas) {
    return Invalid("replicas",
                   absl::StrCat(r.replicas(), " outside [0, ", limits.max_prefetch_replicas, "]"));
  }
  return absl::OkStatus();
}

}  // namespace lazyattn::router
