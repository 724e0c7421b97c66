// Per-worker circuit breakers. A worker is taken out of routing for `open_duration` when it fails
// `failure_threshold` times in a row, or when at least `failure_rate_percent` of its outcomes in
// the last `failure_rate_window` failed (with at least `failure_rate_min_requests` outcomes
// there: a worker that fails every other request never fails twice in a row). After that, exactly
// one request (the probe) may go to it. The probe's success closes the breaker; its failure opens
// it again for another `open_duration`. A probe that never reports back (its caller vanished)
// stops blocking after `open_duration`, and the next request becomes the probe.
//
//   closed --(threshold consecutive failures, or the failure rate)--> open
//   open --(open_duration)--> half-open
//   half-open --(probe succeeds)--> closed;  half-open --(probe fails)--> open
//
// Every request carries the Permit it was sent under, and reports its outcome with it. A breaker
// counts each opening (its generation), so an outcome of a request sent before the breaker last
// opened is old news: its success does not close the breaker (the worker failed since it was
// sent), its failure does not extend the open period, and once the breaker has closed again
// neither counts toward opening it anew. Only the probe's own outcome moves a half-open breaker,
// and only the current probe's release frees the probe slot (a probe that stayed out a whole
// period is replaced, and its late release must not let a third one in).
//
// What counts as a failure is the caller's choice (the router counts transport failures:
// UNAVAILABLE, UNKNOWN, DATA_LOSS). Times are passed in, so tests drive the clock. Thread-safe.
#ifndef LAZYATTN_SERVICES_ROUTER_POLICY_CIRCUIT_BREAKER_H_
#define LAZYATTN_SERVICES_ROUTER_POLICY_CIRCUIT_BREAKER_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace lazyattn::router {

struct CircuitBreakerOptions {
  int failure_threshold = 3;  // >= 1
  absl::Duration open_duration = absl::Seconds(5);
  // Failed outcomes, in percent of all in the window, that open the breaker; 0 turns it off.
  double failure_rate_percent = 50;
  int failure_rate_min_requests = 20;  // >= 1: fewer outcomes in the window never open it
  absl::Duration failure_rate_window = absl::Seconds(30);
};

class CircuitBreakers {
 public:
  enum class State { kClosed, kOpen, kHalfOpen };

  // The right to send one request to a worker, and what its outcome is reported with.
  struct Permit {
    bool granted = false;
    bool probe = false;       // the half-open breaker's one trial request
    uint64_t generation = 0;  // the worker breaker's last opening when granted (0: never)
    uint64_t probe_seq = 0;   // a probe: which of the period's probes (a lost one is replaced)
    explicit operator bool() const { return granted; }
  };

  explicit CircuitBreakers(const CircuitBreakerOptions& options) : options_(options) {}

  // Whether `worker` may be offered a request now; does not take the probe slot.
  bool Available(const std::string& worker, absl::Time now) const;
  // Claims the right to send one request: always when closed; when the open period is over,
  // only the first caller (the probe) until the probe reports. Not granted otherwise.
  Permit TryAcquire(const std::string& worker, absl::Time now);
  // A permit whatever the breaker's state: for requests sent although every worker is out (the
  // router's panic mode). Its outcome counts as that of any request sent under this generation.
  Permit Bypass(const std::string& worker) const;
  void RecordSuccess(const std::string& worker, const Permit& permit, absl::Time now);
  void RecordFailure(const std::string& worker, const Permit& permit, absl::Time now);
  // Gives back a permit without a verdict (the client cancelled, the request never left): a probe
  // slot becomes free again.
  void Release(const std::string& worker, const Permit& permit);
  // Forgets the workers not in `known` (they left the registry).
  void Retain(const std::vector<std::string>& known);

  State StateOf(const std::string& worker, absl::Time now) const;
  size_t tracked_workers() const;

 private:
  // Outcomes in the failure-rate window, in kBuckets slices of it.
  static constexpr int kBuckets = 10;
  struct Bucket {
    int64_t slice = -1;  // which slice of time the counts are for
    int64_t succeeded = 0;
    int64_t failed = 0;
  };
  struct Entry {
    int consecutive_failures = 0;
    bool open = false;
    uint64_t generation = 0;  // which opening was its last (unique over all workers; 0: never)
    absl::Time open_until = absl::InfinitePast();
    bool probe_in_flight = false;
    absl::Time probe_started = absl::InfinitePast();
    uint64_t probe_seq = 0;  // probes granted so far
    std::array<Bucket, kBuckets> window;
  };
  bool AvailableLocked(const Entry& e, absl::Time now) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Adds one outcome to the window; returns whether the failure rate now opens the breaker.
  bool CountOutcome(Entry& e, bool failed, absl::Time now) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Open(Entry& e, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const CircuitBreakerOptions options_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Entry> entries_ ABSL_GUARDED_BY(mu_);
  uint64_t openings_ ABSL_GUARDED_BY(mu_) = 0;  // every breaker's, ever: generations are unique
};

}  // namespace lazyattn::router

#endif  // LAZYATTN_SERVICES_ROUTER_POLICY_CIRCUIT_BREAKER_H_
