// Short-lived guesses "document K is (about to be) on worker W", recorded by the router when it
// sends a request there. The worker's own STORED event reaches kvdir only after its prefill, so
// without these a burst of requests for the same new documents would see no holder anywhere and
// scatter over the cluster, computing the same documents on every worker.
//
// An entry lives `ttl` after its last recording; the table holds at most `max_keys` keys (when it
// is full and nothing has expired, new keys are not recorded: the cost is a missed steer, never
// unbounded memory). A full table is swept for expired keys at most every kFullSweepInterval:
// a sweep walks every key under the one lock (6 ms at 100,000), and sweeping on every Record
// of a table kept full by overload made each request pay it. Times are passed in, so tests drive
// the clock.
#ifndef LAZYATTN_SERVICES_ROUTER_POLICY_SPECULATIVE_ENTRIES_H_
#define LAZYATTN_SERVICES_ROUTER_POLICY_SPECULATIVE_ENTRIES_H_

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/document_key.h"

namespace lazyattn::router {

struct SpeculativeOptions {
  absl::Duration ttl = absl::Seconds(2);  // 0 turns speculative entries off
  int64_t max_keys = 100000;
};

class SpeculativeEntries {
 public:
  static constexpr absl::Duration kFullSweepInterval = absl::Milliseconds(250);

  explicit SpeculativeEntries(const SpeculativeOptions& options) : options_(options) {}

  // Records (or refreshes) `worker` as a holder of every key, until now + ttl, or now + `hold`
  // when given (zero: the entries end now). Nothing while options.ttl is 0 (turned off).
  void Record(std::span<const DocumentKey> keys, const std::string& worker, absl::Time now,
              std::optional<absl::Duration> hold = std::nullopt);
  // Workers recorded for `key` whose entries have not expired at `now`.
  std::vector<std::string> Holders(const DocumentKey& key, absl::Time now) const;
  // Keys currently stored (expired ones included until the next sweep).
  size_t size() const;

 private:
  struct Holder {
    std::string worker;
    absl::Time expires;
  };
  void SweepLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const SpeculativeOptions options_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<DocumentKey, std::vector<Holder>> entries_ ABSL_GUARDED_BY(mu_);
  absl::Time next_sweep_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace lazyattn::router

#endif  // LAZYATTN_SERVICES_ROUTER_POLICY_SPECULATIVE_ENTRIES_H_
