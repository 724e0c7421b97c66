#include "services/worker/engine/sampler.h"

#include <algorithm>
#include <cmath>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "services/worker/engine/top_logprobs.h"

namespace lazyattn {

absl::Status ValidateSamplingParams(const SamplingParams& p, int64_t vocab_size) {
  auto bad = [](absl::string_view field, auto value, absl::string_view rule) {
    return absl::InvalidArgumentError(absl::StrCat(field, " = ", value, ": ", rule));
  };
  if (!(p.temperature >= 0 && p.temperature <= 100)) {
    return bad("temperature", p.temperature, "must be in [0, 100]");
  }
  if (p.top_k < 0) return bad("top_k", p.top_k, "must be >= 0 (0 disables it)");
  if (!(p.top_p > 0 && p.top_p <= 1)) return bad("top_p", p.top_p, "must be in (0, 1]");
  if (!(p.min_p >= 0 && p.min_p <= 1)) return bad("min_p", p.min_p, "must be in [0, 1]");
  if (!(p.repetition_penalty > 0 && p.repetition_penalty <= 100)) {
    return bad("repetition_penalty", p.repetition_penalty, "must be in (0, 100]");
  }
  if (!(p.presence_penalty >= -2 && p.presence_penalty <= 2)) {
    return bad("presence_penalty", p.presence_penalty, "must be in [-2, 2]");
  }
  if (!(p.frequency_penalty >= -2 && p.frequency_penalty <= 2)) {
    return bad("frequency_penalty", p.frequency_penalty, "must be in [-2, 2]");
  }
  if (p.max_tokens < 1) return bad("max_tokens", p.max_tokens, "must be >= 1");
  if (p.top_logprobs < 0 || p.top_logprobs > kMaxTopLogprobs) {
    return bad("top_logprobs", p.top_logprobs,
               absl::StrCat("must be in [0, ", kMaxTopLogprobs, "]"));
  }
  if (p.top_logprobs > 0 && !p.logprobs) {
    return bad("top_logprobs", p.top_logprobs, "needs logprobs (the chosen tokens' own)");
  }
  // limits.max_stop_strings cannot be configured above this (ApiLimitsFromYaml).
  if (p.stop.size() > 16) return bad("stop", p.stop.size(), "at most 16 stop strings");
  for (const auto& s : p.stop) {
    if (s.empty()) return absl::InvalidArgumentError("stop: stop strings must not be empty");
  }
  for (int32_t id : p.stop_token_ids) {
    if (id < 0 || id >= vocab_size) {
      return bad("stop_token_ids", id, absl::StrCat("outside the vocabulary [0, ", vocab_size, ")"));
    }
  }
  for (size_t i = 0; i < p.logit_bias.size(); ++i) {
    const LogitBias& b = p.logit_bias[i];
    if (b.id < 0 || b.id >= vocab_size) {
      return bad("logit_bias", b.id, absl::StrCat("outside the vocabulary [0, ", vocab_size, ")"));
    }
    if (i > 0 && b.id <= p.logit_bias[i - 1].id) {
      return bad("logit_bias", b.id, "ids must be distinct and in increasing order");
    }
    if (!(std::fabs(b.bias) <= kMaxLogitBias)) {
      return bad(absl::StrCat("logit_bias[", b.id, "]"), b.bias,
                 absl::StrCat("must be in [-", kMaxLogitBias, ", ", kMaxLogitBias, "]"));
    }
  }
  return absl::OkStatus();
}

SamplingRowParams RowSamplingParams(const SamplingParams& p, uint64_t step) {
  SamplingRowParams r;
  r.temperature = p.temperature;
  r.top_k = p.top_k;
  r.top_p = p.top_p;
  r.min_p = p.min_p;
  r.repetition_penalty = p.repetition_penalty;
  r.presence_penalty = p.presence_penalty;
  r.frequency_penalty = p.frequency_penalty;
  r.flags = (p.logprobs ? kSampleLogprob : 0) | (p.logit_bias.empty() ? 0 : kLogitBias);
  r.seed = p.seed.value_or(0);
  r.step = step;
  return r;
}

std::vector<PenaltyEntry> PenaltyEntries(std::span<const int32_t> tokens, int64_t prompt_tokens) {
  PenaltyCounts counts;
  const std::span<const PenaltyEntry> entries = counts.Sync(tokens, prompt_tokens);
  return {entries.begin(), entries.end()};
}

void PenaltyCounts::Count(int32_t id, bool in_prompt) {
  auto [it, fresh] = index_.try_emplace(id, static_cast<int32_t>(entries_.size()));
  if (fresh) entries_.push_back({id, 0, 0});
  PenaltyEntry& e = entries_[it->second];
  if (in_prompt) {
    e.in_prompt = 1;
  } else {
    ++e.output_count;
  }
  ++tokens_counted_;
}

std::span<const PenaltyEntry> PenaltyCounts::Sync(std::span<const int32_t> history,
                                                  int64_t prompt_tokens) {
  const int64_t n = static_cast<int64_t>(history.size());
  if (n < counted_ || prompt_tokens != prompt_tokens_) {
    index_.clear();
    entries_.clear();
    counted_ = 0;
    prompt_tokens_ = prompt_tokens;
  }
  for (; counted_ < n; ++counted_) Count(history[counted_], counted_ < prompt_tokens_);
  return entries_;
}

std::vector<PenaltyEntry> RowAdjustments(const SamplingRowParams& row,
                                         std::span<const PenaltyEntry> penalties,
                                         std::span<const LogitBias> logit_bias) {
  std::vector<PenaltyEntry> out;
  if (HasPenalties(row)) out.assign(penalties.begin(), penalties.end());
  if (!(row.flags & kLogitBias) || logit_bias.empty()) return out;
  // One pass over the history's entries (as long as the history's distinct ids, every step)
  // with the few biases (at most limits.max_logit_bias) in a map; the unlisted ones appended.
  absl::flat_hash_map<int32_t, float> bias;
  for (const LogitBias& b : logit_bias) bias[b.id] = b.bias;
  for (PenaltyEntry& e : out) {
    if (auto it = bias.find(e.id); it != bias.end()) {
      e.bias = it->second;
      bias.erase(it);
    }
  }
  for (const LogitBias& b : logit_bias) {  // in id order, so the list does not depend on hashing
    if (bias.contains(b.id)) out.push_back({.id = b.id, .bias = b.bias});
  }
  return out;
}

int32_t ArgMax(std::span<const float> logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

Sampler::Sampler(const SamplingParams& params) : params_(params) {}

int32_t Sampler::Sample(std::span<const float> logits, float* logprob) {
  const SamplingRowParams row = RowSamplingParams(params_, step_++);
  const std::vector<PenaltyEntry> adjust = RowAdjustments(row, {}, params_.logit_bias);
  return SampleRowCpu(logits.data(), static_cast<int32_t>(logits.size()), row, adjust.data(),
                      static_cast<int32_t>(adjust.size()), -1, logprob);
}

}  // namespace lazyattn
