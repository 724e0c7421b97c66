#include "services/worker/server/request_convert.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "services/worker/engine/chat_prompt.h"

namespace lazyattn {
namespace {

absl::Status DocumentsFromProto(
    const google::protobuf::RepeatedPtrField<v1::Document>& docs,
    std::vector<EngineDocument>* out) {
  out->reserve(docs.size());
  for (int i = 0; i < docs.size(); ++i) {
    const v1::Document& d = docs[i];
    EngineDocument doc;
    doc.id = d.id();
    switch (d.content_case()) {
      case v1::Document::kText:
        doc.text = d.text();
        break;
      case v1::Document::kTokens:
        doc.token_ids.emplace(d.tokens().ids().begin(), d.tokens().ids().end());
        break;
      default:
        return absl::InvalidArgumentError(
            absl::StrCat("documents[", i, "]: neither text nor tokens set",
                         d.id().empty() ? "" : absl::StrCat(" (document \"", d.id(), "\")")));
    }
    out->push_back(std::move(doc));
  }
  return absl::OkStatus();
}

absl::StatusOr<SamplingParams> SamplingFromProto(const v1::SamplingParams& s,
                                                 const ModelConfig& config,
                                                 const ConvertOptions& options) {
  SamplingParams p;
  p.temperature = s.temperature();
  p.top_k = s.top_k();
  p.top_p = s.top_p() == 0.0f ? 1.0f : s.top_p();  // proto3 default 0 means off
  if (s.has_seed()) p.seed = s.seed();  // unset: the engine draws a fresh one
  p.max_tokens = s.max_tokens() == 0 ? options.default_max_tokens : s.max_tokens();
  p.stop.assign(s.stop().begin(), s.stop().end());
  p.stop_token_ids.assign(s.stop_token_ids().begin(), s.stop_token_ids().end());
  p.ignore_eos = s.ignore_eos();
  p.min_p = s.min_p();
  p.repetition_penalty = s.repetition_penalty() == 0.0f ? 1.0f : s.repetition_penalty();
  p.presence_penalty = s.presence_penalty();
  p.frequency_penalty = s.frequency_penalty();
  p.logprobs = s.logprobs();
  p.top_logprobs = s.top_logprobs();
  p.logit_bias.reserve(s.logit_bias_size());
  for (const auto& [id, bias] : s.logit_bias()) p.logit_bias.push_back({id, bias});
  std::sort(p.logit_bias.begin(), p.logit_bias.end(),
            [](const LogitBias& a, const LogitBias& b) { return a.id < b.id; });
  // Validated here too so the error names the request field ("sampling.top_k = -1: ...").
  absl::Status st = ValidateSamplingParams(p, config.vocab_size);
  if (!st.ok()) return absl::InvalidArgumentError(absl::StrCat("sampling.", st.message()));
  return p;
}

// Multi-turn: the conversation through the model's chat template, documents at the start of the
// last user turn (CutChatMessages). The validator has checked roles and that system and question
// are empty; checked again here because the worker does not trust its caller.
absl::StatusOr<EngineRequest> WithConversation(const v1::GenerateRequest& request,
                                               const Tokenizer& tokenizer, EngineRequest r) {
  if (!request.system().empty() || !request.question().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        request.system().empty() ? "question" : "system",
        ": must be empty with messages (the conversation carries the system and user turns)"));
  }
  std::vector<ChatMessage> messages;
  messages.reserve(request.messages_size());
  for (const v1::ChatMessage& m : request.messages()) messages.push_back({m.role(), m.content()});
  auto parts = BuildChatPrompt(tokenizer, std::move(messages),
                               /*has_documents=*/request.documents_size() > 0);
  if (!parts.ok()) {
    if (absl::IsInvalidArgument(parts.status())) return parts.status();  // names messages[i]
    return absl::InvalidArgumentError(absl::StrCat(
        "messages: the model's chat template cannot be used: ", parts.status().message()));
  }
  r.system_prefix = std::move(parts->system_prefix);
  r.question = std::move(parts->question);
  return r;
}

}  // namespace

absl::StatusOr<CacheMode> CacheModeFromProto(int mode) {
  switch (mode) {
    case v1::CACHE_MODE_UNSPECIFIED:
    case v1::CACHE_MODE_LAZY:
      return CacheMode::kLazy;
    case v1::CACHE_MODE_FULL:
      return CacheMode::kFull;
    case v1::CACHE_MODE_PREFIX:
      return CacheMode::kPrefix;
    case v1::CACHE_MODE_BLOCK:
      return CacheMode::kBlock;
  }
  return absl::InvalidArgumentError(absl::StrCat("cache_mode: unknown value ", mode,
                                                 " (expected FULL, PREFIX, BLOCK or LAZY)"));
}

absl::StatusOr<EngineRequest> EngineRequestFromProto(const v1::GenerateRequest& request,
                                                     const Tokenizer& tokenizer,
                                                     const ModelConfig& config,
                                                     const ConvertOptions& options) {
  EngineRequest r;
  ASSIGN_OR_RETURN(r.mode, CacheModeFromProto(request.cache_mode()));
  ASSIGN_OR_RETURN(r.sampling, SamplingFromProto(request.sampling(), config, options));
  r.cache_scope.salt = request.cache_salt();
  RETURN_IF_ERROR(DocumentsFromProto(request.documents(), &r.documents));
  if (!request.messages().empty()) return WithConversation(request, tokenizer, std::move(r));
  if (request.question().empty()) {
    // Checked before the chat template adds its text around the question.
    return absl::InvalidArgumentError("question: must not be empty (generation starts after it)");
  }
  auto parts = BuildPrompt(tokenizer, request.chat(), request.system(), request.question(),
                           /*has_documents=*/request.documents_size() > 0);
  if (!parts.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("chat: the model's chat template cannot be used: ", parts.status().message()));
  }
  r.system_prefix = std::move(parts->system_prefix);
  r.question = std::move(parts->question);
  return r;
}

absl::StatusOr<EngineRequest> PrefetchEngineRequest(const v1::PrefetchRequest& request) {
  EngineRequest r;
  ASSIGN_OR_RETURN(r.mode, CacheModeFromProto(request.cache_mode()));
  if (r.mode != CacheMode::kLazy && r.mode != CacheMode::kBlock) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cache_mode: prefetch caches documents in mode LAZY or BLOCK, not ",
        v1::CacheMode_Name(request.cache_mode())));
  }
  if (request.documents().empty()) {
    return absl::InvalidArgumentError("documents: nothing to prefetch");
  }
  RETURN_IF_ERROR(DocumentsFromProto(request.documents(), &r.documents));
  r.cache_scope.salt = request.cache_salt();
  // The engine needs a query to finish the request; one token is enough.
  r.question.assign(1, '\n');  // (not = "\n": GCC 12 warns -Wrestrict, a false positive)
  r.sampling.max_tokens = 1;
  r.sampling.ignore_eos = true;
  r.prefetch = true;
  return r;
}

void UsageToProto(const RequestUsage& u, v1::Usage* out) {
  out->set_prompt_tokens(u.prompt_tokens);
  out->set_cached_tokens(u.cached_tokens);
  out->set_computed_tokens(u.computed_tokens);
  out->set_completion_tokens(u.completion_tokens);
  out->set_documents(u.documents);
  out->set_documents_hit(u.documents_hit);
  out->set_document_hit_tokens(u.document_hit_tokens);
  out->set_document_copied_tokens(u.document_copied_tokens);
  out->set_prefix_tokens(u.prefix_tokens);
}

}  // namespace lazyattn
