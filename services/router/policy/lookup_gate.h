// Whether a request's directory lookup is worth making. Every lookup that fails (no answer within
// kvdir.lookup_timeout_ms, or an error) costs its request up to that timeout before it is routed by
// load. When the directory is down or black-holed that is every request's cost, so after
// `failures_to_skip` lookups in a row fail the directory is presumed down: requests skip the
// lookup and are routed by load at once for a backoff. Then one request's lookup goes out as a
// trial while the others keep skipping; an answer resumes lookups, a failure starts the next
// backoff, twice as long, up to `max_backoff`. Any other answer from the directory (TrialNow) ends
// the backoff early, so a restarted directory is used again within one listing interval.
//
//   looking up --(failures_to_skip failures in a row)--> skipping --(backoff)--> trial
//   trial --(answer)--> looking up;  trial --(failure)--> skipping (backoff doubled)
//
// Outcomes of lookups sent before the gate closed change nothing while it is closed. Times are
// passed in, so tests drive the clock. Thread-safe.
#ifndef LAZYATTN_SERVICES_ROUTER_POLICY_LOOKUP_GATE_H_
#define LAZYATTN_SERVICES_ROUTER_POLICY_LOOKUP_GATE_H_

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace lazyattn::router {

struct LookupGateOptions {
  int failures_to_skip = 3;  // 0: never skip
  absl::Duration base_backoff = absl::Seconds(1);
  absl::Duration max_backoff = absl::Seconds(30);  // >= base_backoff
};

class LookupGate {
 public:
  enum class Decision { kLookUp, kTrial, kSkip };

  explicit LookupGate(const LookupGateOptions& options) : options_(options) {}

  // What this request does. kTrial must be reported with `trial` set; kSkip is not reported.
  Decision Decide(absl::Time now);
  // The outcome of a lookup Decide allowed (kLookUp or kTrial). Returns whether it started or
  // ended skipping (for the log).
  bool Record(bool answered, bool trial, absl::Time now);

  // The directory answered another call (the router's periodic ListWorkers): it may be back, so
  // the next request's lookup is the trial, without waiting out the backoff.
  void TrialNow(absl::Time now);

  bool skipping() const;
  // How long the current backoff lasts (zero while looking up).
  absl::Duration backoff() const;

 private:
  const LookupGateOptions options_;
  mutable absl::Mutex mu_;
  int consecutive_failures_ ABSL_GUARDED_BY(mu_) = 0;
  bool skipping_ ABSL_GUARDED_BY(mu_) = false;
  absl::Duration backoff_ ABSL_GUARDED_BY(mu_) = absl::ZeroDuration();
  absl::Time skip_until_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  bool trial_in_flight_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace lazyattn::router

#endif  // LAZYATTN_SERVICES_ROUTER_POLICY_LOOKUP_GATE_H_
