// Puts the routing pieces together for one request: predicted hits (the directory's residency plus
// the router's own speculative entries), load (the worker's reported queue, or the router's own
// in-flight count when that is larger, since heartbeats lag), circuit breakers, and the policy.
//
// Predicted hits are the tokens of the request's documents a worker holds in a form the request's
// cache mode reuses (docs/router.md, "Predictions"): the directory answers that rule
// (kvdir.proto, LookupRequest.mode), and the router's speculative entries follow it: mode lazy
// keys them by document (position-free KV is reusable at any position, so the order of the
// documents does not enter), mode block by (document, offset), and a block document the router
// cannot place (kUnplaced) is predicted as no hit.
#ifndef LAZYATTN_SERVICES_ROUTER_POLICY_WORKER_SELECTOR_H_
#define LAZYATTN_SERVICES_ROUTER_POLICY_WORKER_SELECTOR_H_

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/document_key.h"
#include "services/router/policy/circuit_breaker.h"
#include "services/router/policy/claim_credit.h"
#include "services/router/policy/document_placement.h"
#include "services/router/policy/outlier_detector.h"
#include "services/router/policy/routing_policy.h"
#include "services/router/policy/speculative_entries.h"

namespace lazyattn::router {

// One distinct document of the request.
struct DocumentRef {
  DocumentKey key;
  int64_t estimated_tokens = 0;  // exact for token documents, bytes / bytes-per-token for text
  // The most tokens the document can have (exact for token documents); 0: unknown (no cap). A
  // directory's claim of more resident tokens than the request's documents can have is capped at
  // this: a worker that announced a document with 2^40 tokens drew every request carrying it.
  int64_t max_tokens = 0;
  int document_index = 0;        // its first occurrence in the request's documents
  // Mode block: the KV is reusable only at `offset`, the global offset the request places the
  // document at (kUnplaced: unknown, never predicted as a hit by the directory). Mode lazy:
  // false, the offsets unused.
  bool positional = false;
  int64_t offset = kUnplaced;
  // Mode block: the offset from the first document (kUnplaced after a text document) and the
  // prompt prefix's fingerprint. Together they name the global offset even before the router
  // has learned the prefix's length, so speculative entries work from a prefix's first request.
  int64_t relative_offset = kUnplaced;
  uint64_t prefix = 0;
};

// The key of `doc`'s speculative entries: its document key in mode lazy, (key, prefix, relative
// offset) mixed into one key in mode block; nullopt for a block document after a text document
// (nothing to record or predict).
std::optional<DocumentKey> SpeculativeKey(const DocumentRef& doc);

// Mode block: sets every ref's `positional`, its `offset` from PlaceDocuments(prefix_tokens,
// exact_tokens), its `relative_offset` from PlaceDocuments(0, exact_tokens), each indexed by the
// ref's document_index (out of range: kUnplaced), and `prefix`.
void PlaceBlockDocuments(std::span<DocumentRef> refs, uint64_t prefix,
                         std::optional<int64_t> prefix_tokens,
                         std::span<const int64_t> exact_tokens);

// One live worker, as the directory (or the worker itself) last reported it.
struct WorkerObservation {
  std::string id;
  // host:port; the key of health-probe ejection (a restarted worker keeps its id on a new
  // address, and must not inherit the old address's ejection). Empty: the id is the key.
  std::string address;
  int64_t queued_prefill_tokens = 0;
  int64_t requests = 0;         // running + waiting, as reported
  int64_t router_inflight = 0;  // requests this router has sent there and not seen finish
  int64_t resident_tokens = 0;  // tokens of the request's documents the directory says it holds
  std::vector<bool> resident;   // per DocumentRef, same order; empty when unknown
  int64_t copyable_tokens = 0;  // mode block: held at other offsets only (ranked, not predicted)
  // The three counts above and the load are another process's answer (the directory's, from
  // what the worker announced), taken as they came: Select clamps the load into
  // [0, kMaxObservedTokens], resident_tokens to what the documents marked resident can have
  // (all of them when `resident` is unknown) and copyable_tokens to what the others can have
  // (DocumentRef::max_tokens), so no answer overflows a sum or outbids the request's documents.
};

// Far beyond any model's context times any document count; a larger count is not a real one.
inline constexpr int64_t kMaxObservedTokens = int64_t{1} << 40;

struct Selection {
  std::vector<size_t> order;                  // indices into the observations, best first
  std::vector<int64_t> predicted_hit_tokens;  // per observation
  // Per observation: the directory's claims there, resident + copyable tokens (capped as the
  // prediction is), when no speculative entry counts in its prediction; else -1. What
  // ClaimCredit::Observe checks against the worker's answer.
  std::vector<int64_t> claimed_tokens;
  std::vector<int64_t> claimed_copy_tokens;  // ... of which copyable (-1 likewise)
  bool imbalance_fallback = false;
  bool breaker_panic = false;  // every worker was out (breaker or ejection): all offered anyway
};

class WorkerSelector {
 public:
  WorkerSelector(const PolicyOptions& policy, const SpeculativeOptions& speculative,
                 const CircuitBreakerOptions& breakers, const OutlierOptions& outliers = {})
      : policy_(policy), speculative_(speculative), breakers_(breakers), outliers_(outliers) {}

  // Thread-safe. A worker's directory hits and copies count in its rank at its ClaimCredit (its
  // prediction stays the claim). Workers whose breaker is open or that health probing ejected
  // are left out of the order. If that leaves none, the workers health probing admits are offered
  // regardless of their breakers, and if none is admitted, every worker (a possibly-recovered
  // worker beats a certain failure).
  Selection Select(std::span<const WorkerObservation> workers, std::span<const DocumentRef> docs,
                   absl::Time now);
  // Records speculative entries for the worker a request was sent to, for the TTL or `hold`
  // (SpeculativeEntries::Record).
  void RecordChoice(std::span<const DocumentRef> docs, const std::string& worker, absl::Time now,
                    std::optional<absl::Duration> hold = std::nullopt);

  RoutingPolicy& policy() { return policy_; }
  SpeculativeEntries& speculative() { return speculative_; }
  CircuitBreakers& breakers() { return breakers_; }
  OutlierDetector& outliers() { return outliers_; }
  ClaimCredit& claims() { return claims_; }
  // Tokens before the documents per prompt prefix, learned from the workers' answers.
  PrefixLengths& prefix_lengths() { return prefix_lengths_; }

 private:
  RoutingPolicy policy_;
  SpeculativeEntries speculative_;
  CircuitBreakers breakers_;
  OutlierDetector outliers_;
  ClaimCredit claims_;
  PrefixLengths prefix_lengths_;
};

}  // namespace lazyattn::router

#endif  // LAZYATTN_SERVICES_ROUTER_POLICY_WORKER_SELECTOR_H_
