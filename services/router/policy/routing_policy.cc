#include "services/router/policy/routing_policy.h"

#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace lazyattn::router {

absl::StatusOr<PolicyKind> ParsePolicyKind(std::string_view name) {
  if (name == "cache_aware") return PolicyKind::kCacheAware;
  if (name == "least_loaded") return PolicyKind::kLeastLoaded;
  if (name == "round_robin") return PolicyKind::kRoundRobin;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown policy \"", std::string(name),
                   "\" (expected cache_aware, least_loaded or round_robin)"));
}

std::string_view PolicyKindName(PolicyKind kind) {
  switch (kind) {
    case PolicyKind::kCacheAware:
      return "cache_aware";
    case PolicyKind::kLeastLoaded:
      return "least_loaded";
    case PolicyKind::kRoundRobin:
      return "round_robin";
  }
  return "unknown";
}

double RoutingPolicy::Load(const Candidate& c) const {
  return options_.queued_token_weight * static_cast<double>(c.queued_prefill_tokens) +
         static_cast<double>(options_.running_request_tokens) * static_cast<double>(c.requests);
}

Ranking RoutingPolicy::Rank(std::span<const Candidate> candidates) {
  Ranking ranking;
  const size_t n = candidates.size();
  if (n == 0) return ranking;

  // Rotation position of each candidate over a base order by id (independent of input order).
  std::vector<size_t> by_id(n);
  std::iota(by_id.begin(), by_id.end(), 0);
  std::sort(by_id.begin(), by_id.end(),
            [&](size_t a, size_t b) { return candidates[a].id < candidates[b].id; });
  const size_t shift = rotation_.fetch_add(1, std::memory_order_relaxed) % n;
  std::vector<size_t> tie(n);
  for (size_t pos = 0; pos < n; ++pos) tie[by_id[pos]] = (pos + n - shift) % n;

  std::vector<double> load(n);
  for (size_t i = 0; i < n; ++i) load[i] = Load(candidates[i]);

  ranking.order.resize(n);
  std::iota(ranking.order.begin(), ranking.order.end(), 0);
  auto by_load = [&](size_t a, size_t b) {
    if (load[a] != load[b]) return load[a] < load[b];
    return tie[a] < tie[b];
  };

  switch (options_.kind) {
    case PolicyKind::kRoundRobin:
      std::sort(ranking.order.begin(), ranking.order.end(),
                [&](size_t a, size_t b) { return tie[a] < tie[b]; });
      break;
    case PolicyKind::kLeastLoaded:
      std::sort(ranking.order.begin(), ranking.order.end(), by_load);
      break;
    case PolicyKind::kCacheAware: {
      std::sort(ranking.order.begin(), ranking.order.end(), [&](size_t a, size_t b) {
        const double sa = static_cast<double>(candidates[a].hit_tokens) +
                          options_.copy_token_weight *
                              static_cast<double>(candidates[a].copy_tokens) -
                          load[a];
        const double sb = static_cast<double>(candidates[b].hit_tokens) +
                          options_.copy_token_weight *
                              static_cast<double>(candidates[b].copy_tokens) -
                          load[b];
        if (sa != sb) return sa > sb;
        return by_load(a, b);
      });
      const double best = load[ranking.order.front()];
      const double least = *std::min_element(load.begin(), load.end());
      if (best > options_.imbalance_ratio * least &&
          best - least > static_cast<double>(options_.imbalance_min_tokens)) {
        std::sort(ranking.order.begin(), ranking.order.end(), by_load);
        ranking.imbalance_fallback = true;
      }
      break;
    }
  }
  return ranking;
}

}  // namespace lazyattn::router
