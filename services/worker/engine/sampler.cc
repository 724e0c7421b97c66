#include "services/worker/engine/sampler.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

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
  if (p.max_tokens < 1) return bad("max_tokens", p.max_tokens, "must be >= 1");
  if (p.stop.size() > 16) return bad("stop", p.stop.size(), "at most 16 stop strings");
  for (const auto& s : p.stop) {
    if (s.empty()) return absl::InvalidArgumentError("stop: stop strings must not be empty");
  }
  for (int32_t id : p.stop_token_ids) {
    if (id < 0 || id >= vocab_size) {
      return bad("stop_token_ids", id, absl::StrCat("outside the vocabulary [0, ", vocab_size, ")"));
    }
  }
  return absl::OkStatus();
}

int32_t ArgMax(std::span<const float> logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {}

int32_t Sampler::Sample(std::span<const float> logits) {
  if (params_.temperature == 0) return ArgMax(logits);
  const float inv_t = 1.0f / params_.temperature;
  candidates_.clear();
  candidates_.reserve(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) {
    candidates_.emplace_back(logits[i] * inv_t, static_cast<int32_t>(i));
  }
  auto by_logit = [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  size_t keep = candidates_.size();
  if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < keep) {
    keep = params_.top_k;
    std::partial_sort(candidates_.begin(), candidates_.begin() + keep, candidates_.end(), by_logit);
  } else {
    std::sort(candidates_.begin(), candidates_.end(), by_logit);
  }
  // Softmax over the kept candidates (sorted, so the first is the maximum).
  const float max_logit = candidates_[0].first;
  std::vector<double> probs(keep);
  double sum = 0;
  for (size_t i = 0; i < keep; ++i) sum += probs[i] = std::exp(candidates_[i].first - max_logit);
  if (params_.top_p < 1) {
    double cumulative = 0;
    size_t n = 0;
    while (n < keep) {
      cumulative += probs[n++] / sum;
      if (cumulative >= params_.top_p) break;
    }
    keep = n;
    sum = 0;
    for (size_t i = 0; i < keep; ++i) sum += probs[i];
  }
  std::uniform_real_distribution<double> uniform(0.0, sum);
  const double r = uniform(rng_);
  double acc = 0;
  for (size_t i = 0; i < keep; ++i) {
    acc += probs[i];
    if (r < acc) return candidates_[i].second;
  }
  return candidates_[keep - 1].second;
}

}  // namespace lazyattn
