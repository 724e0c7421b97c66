// How much of a worker's directory claims the ranking believes, learned from what the worker
// reports it reused after the requests those claims drew.
//
// The directory stores what each worker announces; the router caps a claim at the request's
// documents' sizes (WorkerSelector), but a worker that announces documents it does not hold
// within their real sizes draws every request carrying them. Each answer says what the worker
// reused: Usage.document_hit_tokens (KV under the request's own key) + document_copied_tokens
// (mode block: KV copied from another offset; a worker that predates it has its hits checked
// against the resident claim alone). After a request whose prediction was the
// directory's claims alone (resident and copyable tokens; no speculative entry, no estimate from
// text length), the router records the claim and the reuse here. Each request weighs the same,
// however large its documents (one large miss a client arranges, by evicting a document with a
// larger one, moves the mean by one request's share):
//
//   share(request) = min(reused, claimed) / claimed
//   credit = the mean share, each older request weighing `decay` of the next, once it is below
//            `distrust_below` and at least `min_observations` requests were observed; else 1
//
// WorkerSelector multiplies the worker's directory hits and copies by its credit when ranking
// (its predictions stay the claims, so they keep being checked and a worker whose claims come
// true again regains credit). An honest worker misses what it evicted between the lookup and its
// admission (docs/router.md, "Predictions": at most a fifth of block-mode requests under a KV
// budget far below the working set), well above the default 0.5.
//
// What it cannot catch: a worker that lies in its answers too (the worker is the only witness of
// its cache); claims on requests it fails or hands back before answering (those go to the
// circuit breaker); a request whose prediction has a speculative part; and, below the threshold,
// up to half of a worker's claims being false. It bounds an honest worker with stale or wrong
// announcements, and a compromised one that does not also forge its usage.
//
// Keyed by worker id; at most kMaxWorkers entries (a new worker past it is not tracked, credit 1).
// Thread-safe.
#ifndef LAZYATTN_SERVICES_ROUTER_POLICY_CLAIM_CREDIT_H_
#define LAZYATTN_SERVICES_ROUTER_POLICY_CLAIM_CREDIT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"

namespace lazyattn::router {

struct ClaimCreditOptions {
  double decay = 1.0 - 1.0 / 32;  // weight of an observation one request older; (0, 1)
  int64_t min_observations = 8;   // requests observed before a worker can lose credit
  double distrust_below = 0.5;    // (0, 1]
};

// What one observation changed (for the router's log line).
struct ClaimCreditChange {
  bool lost = false;      // the worker's credit fell below 1
  bool regained = false;  // ... came back to 1
  double credit = 1;
  double share = 1;  // the mean share reused, after it
};

class ClaimCredit {
 public:
  explicit ClaimCredit(const ClaimCreditOptions& options = {}) : options_(options) {}

  // A request `worker` served whose prediction was its directory claims of `claimed` tokens (> 0;
  // smaller claims are ignored), of which it reports reusing `reused` (hits and copies).
  ClaimCreditChange Observe(const std::string& worker, int64_t claimed, int64_t reused);
  // In [0, 1]; 1 for a worker never observed.
  double Credit(const std::string& worker) const;
  // Forgets workers not in `known` (they left the registry), except those without full credit:
  // a worker leaving and coming back does not regain it.
  void Retain(const std::vector<std::string>& known);
  // How many of `among` have a credit below 1 now.
  int64_t Distrusted(const std::vector<std::string>& among) const;

  static constexpr size_t kMaxWorkers = 4096;

 private:
  struct Entry {
    double shares = 0, weight = 0;  // decayed sums of the shares and of the requests
    int64_t count = 0;
    double credit = 1;
  };
  double CreditOf(const Entry& e) const;

  const ClaimCreditOptions options_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Entry> entries_ ABSL_GUARDED_BY(mu_);
};

}  // namespace lazyattn::router

#endif  // LAZYATTN_SERVICES_ROUTER_POLICY_CLAIM_CREDIT_H_
