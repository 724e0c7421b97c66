// Per-worker circuit breakers. A worker that fails `failure_threshold` times in a row is taken out
// of routing for `open_duration`; after that, exactly one request (the probe) may go to it. The
// probe's success closes the breaker; its failure opens it again for another `open_duration`. A
// probe that never reports back (its caller vanished) stops blocking after `open_duration`, and
// the next request becomes the probe.
//
//   closed --(threshold consecutive failures)--> open --(open_duration)--> half-open
//   half-open --(probe succeeds)--> closed;  half-open --(probe fails)--> open
//
// What counts as a failure is the caller's choice (the router counts transport failures:
// UNAVAILABLE, UNKNOWN, DATA_LOSS). Times are passed in, so tests drive the clock.
#ifndef LAZYATTN_SERVICES_ROUTER_POLICY_CIRCUIT_BREAKER_H_
#define LAZYATTN_SERVICES_ROUTER_POLICY_CIRCUIT_BREAKER_H_

#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace lazyattn::router {

struct CircuitBreakerOptions {
  int failure_threshold = 3;  // >= 1
  absl::Duration open_duration = absl::Seconds(5);
};

class CircuitBreakers {
 public:
  enum class State { kClosed, kOpen, kHalfOpen };

  explicit CircuitBreakers(const CircuitBreakerOptions& options) : options_(options) {}

  // Whether `worker` may be offered a request now; does not take the probe slot.
  bool Available(const std::string& worker, absl::Time now) const;
  // Claims the right to send one request: always when closed; when the open period is over,
  // only the first caller (the probe) until the probe reports. Thread-safe.
  bool TryAcquire(const std::string& worker, absl::Time now);
  void RecordSuccess(const std::string& worker);
  void RecordFailure(const std::string& worker, absl::Time now);
  // Gives back a probe slot taken by TryAcquire without a verdict (the client cancelled).
  void Release(const std::string& worker);

  State StateOf(const std::string& worker, absl::Time now) const;

 private:
  struct Entry {
    int consecutive_failures = 0;
    bool open = false;
    absl::Time open_until = absl::InfinitePast();
    bool probe_in_flight = false;
    absl::Time probe_started = absl::InfinitePast();
  };
  bool AvailableLocked(const Entry& e, absl::Time now) const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  const CircuitBreakerOptions options_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Entry> entries_ ABSL_GUARDED_BY(mu_);
};

}  // namespace lazyattn::router

#endif  // LAZYATTN_SERVICES_ROUTER_POLICY_CIRCUIT_BREAKER_H_
