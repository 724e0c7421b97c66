#include "services/router/server/worker_stream_check.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "services/router/policy/worker_selector.h"

namespace lazyattn::router {

using lazyattn::v1::GenerateResponse;
using lazyattn::v1::TokenChunk;

WorkerStreamCheck::Bounds WorkerStreamCheck::For(const lazyattn::v1::GenerateRequest& request,
                                                 const lazyattn::v1::ModelInfo& model,
                                                 int64_t max_tokens_limit) {
  Bounds b;
  b.vocab_size = model.vocab_size() > 0 ? model.vocab_size() : 0;
  b.max_context_tokens = model.max_context_tokens() > 0 ? model.max_context_tokens() : 0;
  b.top_logprobs = request.sampling().top_logprobs() > 0 ? request.sampling().top_logprobs() : 0;
  if (b.top_logprobs > 0 && model.max_top_logprobs() >= b.top_logprobs) {
    b.exact_top_logprobs =
        b.vocab_size > 0 ? std::min(b.top_logprobs, b.vocab_size) : b.top_logprobs;
  }
  // max_tokens 0 is the worker's own default, unknown here. It is within the worker's
  // limits.max_tokens, which a cluster sets alike everywhere, and no worker generates past its
  // context: so the smaller of the two bounds it. The context alone would not: it is the worker's
  // own report, and a hostile worker reporting 2^62 could then stream into the router's memory
  // for as long as the client waits.
  if (request.sampling().max_tokens() > 0) {
    b.max_tokens = request.sampling().max_tokens();
  } else if (max_tokens_limit > 0 && b.max_context_tokens > 0) {
    b.max_tokens = std::min(b.max_context_tokens, max_tokens_limit);
  } else {
    b.max_tokens = std::max<int64_t>(std::max(max_tokens_limit, b.max_context_tokens), 0);
  }
  return b;
}

std::string WorkerStreamCheck::Next(const GenerateResponse& message) {
  if (final_sent_) {
    return "a message after the final one (the stream must end with its final message)";
  }
  switch (message.event_case()) {
    case GenerateResponse::kToken:
      return NextToken(message.token());
    case GenerateResponse::kFinal:
      final_sent_ = true;
      return NextFinal(message.final());
    case GenerateResponse::kPrefillProgress: {
      const int64_t ready = message.prefill_progress().prompt_tokens_ready();
      if (ready < 0) {
        return absl::StrCat("prefill_progress.prompt_tokens_ready ", ready, " is negative");
      }
      if (bounds_.max_context_tokens > 0 && ready > bounds_.max_context_tokens) {
        return absl::StrCat("prefill_progress.prompt_tokens_ready ", ready,
                            " past the model's context of ", bounds_.max_context_tokens, " tokens");
      }
      return "";
    }
    case GenerateResponse::EVENT_NOT_SET:
      return "";
  }
  return "";
}

std::string WorkerStreamCheck::NextFinal(const lazyattn::v1::Final& final) {
  const lazyattn::v1::Usage& u = final.usage();
  for (const auto& [name, value] :
       {std::pair<const char*, int64_t>{"prompt_tokens", u.prompt_tokens()},
        {"cached_tokens", u.cached_tokens()},
        {"computed_tokens", u.computed_tokens()},
        {"completion_tokens", u.completion_tokens()},
        {"documents", u.documents()},
        {"documents_hit", u.documents_hit()},
        {"document_hit_tokens", u.document_hit_tokens()},
        {"document_copied_tokens", u.document_copied_tokens()},
        {"prefix_tokens", u.prefix_tokens()}}) {
    if (value < 0) return absl::StrCat("final.usage.", name, " ", value, " is negative");
  }
  return "";
}

void ClampUsage(lazyattn::v1::Usage& usage) {
  const auto clamp = [](int64_t n) { return std::min(n, kMaxObservedTokens); };
  usage.set_prompt_tokens(clamp(usage.prompt_tokens()));
  usage.set_cached_tokens(clamp(usage.cached_tokens()));
  usage.set_computed_tokens(clamp(usage.computed_tokens()));
  usage.set_completion_tokens(clamp(usage.completion_tokens()));
  usage.set_documents(clamp(usage.documents()));
  usage.set_documents_hit(clamp(usage.documents_hit()));
  usage.set_document_hit_tokens(clamp(usage.document_hit_tokens()));
  if (usage.has_document_copied_tokens()) {
    usage.set_document_copied_tokens(clamp(usage.document_copied_tokens()));
  }
  usage.set_prefix_tokens(clamp(usage.prefix_tokens()));
}

std::string WorkerStreamCheck::NextToken(const TokenChunk& token) {
  const int32_t id = token.token_id();
  if (token.has_logprob() && !std::isfinite(token.logprob())) {
    // A sampled token's log-probability is finite; JSON has no NaN or infinity to relay it in.
    return absl::StrCat("token.logprob ", token.logprob(), " is not a finite number");
  }
  if (static_cast<int64_t>(token.token_bytes().size()) > kTextBytesPerToken) {
    return absl::StrCat("token.token_bytes: ", token.token_bytes().size(),
                        " bytes (a token's bytes are at most ", kTextBytesPerToken, ")");
  }
  text_bytes_ += static_cast<int64_t>(token.text().size());
  if (text_bytes_ > kTextBytesPerToken * (tokens_ + 1) + kTextSlackBytes) {
    return absl::StrCat("token.text: ", text_bytes_, " bytes of text for ", tokens_ + 1,
                        " tokens (a token's text is a token's bytes, at most ", kTextBytesPerToken,
                        " a token, plus held-back text)");
  }
  if (id == -1) {
    if (held_back_sent_) return "token.token_id -1 twice (one held-back text chunk at most)";
    if (!token.top_logprobs().empty()) {
      return absl::StrCat("token.top_logprobs: ", token.top_logprobs_size(),
                          " entries on the held-back text chunk (token_id -1 is no token)");
    }
    held_back_sent_ = true;
    return "";
  }
  if (id < -1) return absl::StrCat("token.token_id ", id, " is negative (only -1 may be)");
  if (bounds_.vocab_size > 0 && id >= bounds_.vocab_size) {
    return absl::StrCat("token.token_id ", id, " outside the model's vocabulary [0, ",
                        bounds_.vocab_size, ")");
  }
  if (held_back_sent_) {
    return absl::StrCat("token.token_id ", id,
                        " after the held-back text chunk (token_id -1 ends the tokens)");
  }
  if (bounds_.max_tokens > 0 && tokens_ >= bounds_.max_tokens) {
    return absl::StrCat("more than ", bounds_.max_tokens,
                        " tokens (the request's sampling.max_tokens; when it is 0, the smaller of "
                        "the model's context and the router's limits.max_tokens)");
  }
  if (std::string error = CheckTopLogprobs(token); !error.empty()) return error;
  ++tokens_;
  return "";
}

std::string WorkerStreamCheck::CheckTopLogprobs(const TokenChunk& token) {
  const int n = token.top_logprobs_size();
  if (bounds_.exact_top_logprobs > 0 && n != bounds_.exact_top_logprobs) {
    return absl::StrCat("token.top_logprobs: ", n, " entries, the request's ",
                        bounds_.exact_top_logprobs,
                        " expected (sampling.top_logprobs; the worker advertises them)");
  }
  if (n == 0) return "";
  if (n > bounds_.top_logprobs) {
    return bounds_.top_logprobs == 0
               ? absl::StrCat("token.top_logprobs: ", n,
                              " entries, but the request asked for none (sampling.top_logprobs 0)")
               : absl::StrCat("token.top_logprobs: ", n, " entries, more than the request's ",
                              bounds_.top_logprobs, " (sampling.top_logprobs)");
  }
  for (int i = 0; i < n; ++i) {
    const lazyattn::v1::TopLogprob& e = token.top_logprobs(i);
    const float logprob = e.logprob();
    if (!std::isfinite(logprob)) {
      // Probability 0 is sent as -9999 (inference.proto): JSON has no NaN or infinity.
      return absl::StrCat("token.top_logprobs[", i, "].logprob ", logprob,
                          " is not a finite number");
    }
    if (logprob > kMaxLogprob) {
      return absl::StrCat("token.top_logprobs[", i, "].logprob ", logprob,
                          " is above 0 (not a log-probability)");
    }
    if (i > 0 && logprob > token.top_logprobs(i - 1).logprob()) {
      return absl::StrCat("token.top_logprobs[", i, "].logprob ", logprob, " above entry ", i - 1,
                          "'s ", token.top_logprobs(i - 1).logprob(),
                          " (the entries come most likely first)");
    }
    if (e.token_id() < 0) {
      return absl::StrCat("token.top_logprobs[", i, "].token_id ", e.token_id(), " is negative");
    }
    if (bounds_.vocab_size > 0 && e.token_id() >= bounds_.vocab_size) {
      return absl::StrCat("token.top_logprobs[", i, "].token_id ", e.token_id(),
                          " outside the model's vocabulary [0, ", bounds_.vocab_size, ")");
    }
    if (static_cast<int64_t>(e.token_bytes().size()) > kTextBytesPerToken) {
      return absl::StrCat("token.top_logprobs[", i, "].token_bytes: ", e.token_bytes().size(),
                          " bytes (a token's bytes are at most ", kTextBytesPerToken, ")");
    }
    alternative_bytes_ += static_cast<int64_t>(e.token_bytes().size());
  }
  if (alternative_bytes_ > kTextBytesPerToken * (tokens_ + 1) + kTextSlackBytes) {
    return absl::StrCat("token.top_logprobs: ", alternative_bytes_, " bytes of alternatives for ",
                        tokens_ + 1, " tokens (at most ", kTextBytesPerToken,
                        " a token on average, as the text)");
  }
  return "";
}

}  // namespace lazyattn::router
