// How the router orders the workers for one request. Plain C++ (no gRPC), driven by an explicit
// clock-free input: the caller gathers each worker's predicted hit tokens and load.
//
// Units: everything is in prefill tokens, the work a worker does before this request's first token.
//
//   load(w)  = queued_token_weight * queued_prefill_tokens(w)
//            + running_request_tokens * requests(w)
//   score(w) = hit_tokens(w) + copy_token_weight * copy_tokens(w) - load(w)   (cache_aware)
//
// With queued_token_weight 1 the score is minus the predicted time to first token in token units:
// the prompt tokens this worker must compute (prompt - hit) plus the prefill queued ahead of us,
// dropping the prompt length, which is the same on every worker. Each running request adds a fixed
// cost for the decode steps interleaved with our prefill.
//
// copy_tokens (mode block): document tokens the worker holds at another offset; it copies them
// re-rotated instead of encoding, most of a hit's saving, though no hit (predictions count only
// hits).
//
// Imbalance guard (cache_aware): let b be the best-scoring worker and m the least loaded. When
//   load(b) > imbalance_ratio * load(m)  and  load(b) - load(m) > imbalance_min_tokens
// the request goes by load instead (least_loaded order), so one hot document set cannot pile its
// whole stream onto one worker while others idle.
//
// least_loaded: ascending load. round_robin: a rotating start over the workers sorted by id.
// Ties (equal score or load) rotate with a counter, so idle workers share work evenly.
#ifndef LAZYATTN_SERVICES_ROUTER_POLICY_ROUTING_POLICY_H_
#define LAZYATTN_SERVICES_ROUTER_POLICY_ROUTING_POLICY_H_

#include <atomic>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace lazyattn::router {

enum class PolicyKind { kCacheAware, kLeastLoaded, kRoundRobin };

// "cache_aware", "least_loaded", "round_robin"; InvalidArgument listing them otherwise.
absl::StatusOr<PolicyKind> ParsePolicyKind(std::string_view name);
std::string_view PolicyKindName(PolicyKind kind);

struct PolicyOptions {
  PolicyKind kind = PolicyKind::kCacheAware;
  double queued_token_weight = 1.0;     // >= 0
  int64_t running_request_tokens = 64;  // >= 0, cost of one running or waiting request
  double imbalance_ratio = 2.0;         // >= 1
  int64_t imbalance_min_tokens = 4096;  // >= 0
  double copy_token_weight = 0.9;       // [0, 1]: a copy's saving relative to a hit's
};

// One worker as the policy sees it.
struct Candidate {
  std::string id;
  int64_t hit_tokens = 0;             // predicted tokens of this request's documents already there
  int64_t queued_prefill_tokens = 0;  // >= 0
  int64_t requests = 0;               // running + waiting (or the router's in-flight count)
  int64_t copy_tokens = 0;            // mode block: tokens held at another offset (copied)
};

struct Ranking {
  std::vector<size_t> order;  // indices into the candidates, best first; all of them
  bool imbalance_fallback = false;
};

class RoutingPolicy {
 public:
  explicit RoutingPolicy(const PolicyOptions& options) : options_(options) {}

  // Thread-safe. Empty order for no candidates.
  Ranking Rank(std::span<const Candidate> candidates);

  double Load(const Candidate& c) const;
  const PolicyOptions& options() const { return options_; }

 private:
  PolicyOptions options_;
  std::atomic<uint64_t> rotation_{0};
};

}  // namespace lazyattn::router

#endif  // LAZYATTN_SERVICES_ROUTER_POLICY_ROUTING_POLICY_H_
