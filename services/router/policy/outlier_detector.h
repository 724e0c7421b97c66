// Active health checking with outlier ejection, in the manner of Envoy's outlier detection: the
// router probes every worker (grpc.health.v1) and reports each outcome here.
//
//   - A probe answered NOT_SERVING ejects the worker at once (it said so itself: a broken KV
//     pool, a drain). `consecutive_failures` probes in a row that fail (no answer in time, a
//     refused connection) eject it too.
//   - The n-th ejection in a row lasts base_ejection * n, capped at max_ejection; a worker that
//     stays admitted for max_ejection starts again from n = 1.
//   - An ejected worker is re-admitted by the first successful (SERVING) probe after its
//     ejection time; until then it gets no request, however long the ejection time is past.
//
// Probe outcomes are the only input: request failures go to the circuit breakers. Workers are
// keyed by the caller's choice (the router uses OutlierKey: the address and the worker's id, so
// another worker taking a departed one's address starts admitted). Times are passed in, so tests
// drive the clock. Thread-safe.
#ifndef LAZYATTN_SERVICES_ROUTER_POLICY_OUTLIER_DETECTOR_H_
#define LAZYATTN_SERVICES_ROUTER_POLICY_OUTLIER_DETECTOR_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace lazyattn::router {

struct OutlierOptions {
  int consecutive_failures = 2;  // >= 1: failed probes in a row that eject
  absl::Duration base_ejection = absl::Seconds(2);
  absl::Duration max_ejection = absl::Seconds(30);  // >= base_ejection
};

enum class ProbeResult { kServing, kNotServing, kFailed };

// The router's key for a worker: its address and id (the id alone where there is no address).
std::string OutlierKey(std::string_view id, std::string_view address);

class OutlierDetector {
 public:
  explicit OutlierDetector(const OutlierOptions& options) : options_(options) {}

  // One probe's outcome. Returns true when this probe ejected the worker (for the log and the
  // ejection counter); `why` describes it then.
  bool Record(const std::string& worker, ProbeResult result, absl::Time now,
              std::string* why = nullptr);
  // Whether `worker` may be sent requests. Unknown workers are admitted.
  bool Admitted(const std::string& worker) const;
  // Forgets workers not in `known` (they left the registry), except those ejected within the
  // last max_ejection (at most kMaxDepartedKept, the latest ejections first): a worker that
  // froze, lapsed its kvdir lease and came back is still out until its ejection time has passed
  // and a probe says SERVING (logged as a re-admission), and its next ejection is longer, as if
  // it had never left.
  void Retain(const std::vector<std::string>& known, absl::Time now);
  static constexpr size_t kMaxDepartedKept = 1024;
  int64_t ejections() const;

 private:
  struct Entry {
    int consecutive_failures = 0;
    bool ejected = false;
    int ejection_streak = 0;  // ejections since the worker last stayed admitted max_ejection
    absl::Time ejected_until = absl::InfinitePast();
    absl::Time admitted_since = absl::InfinitePast();
  };

  const OutlierOptions options_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Entry> entries_ ABSL_GUARDED_BY(mu_);
  int64_t ejections_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace lazyattn::router

#endif  // LAZYATTN_SERVICES_ROUTER_POLICY_OUTLIER_DETECTOR_H_
