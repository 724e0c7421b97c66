// Query-of-death containment (DESIGN.md section 4, "a query of death"): a request whose attempts
// keep killing workers must cost at most two of them, then be refused for a while.
//
// The router reports each attempt that ended because the worker's connection was lost mid-call
// (the worker process died while it held the request) under the request's content fingerprint
// (request_fingerprint.h) and the worker's id. The first loss of a fingerprint is remembered; the
// request fails over as usual (an ordinary crash must not cost a request). The second loss within
// `ttl` quarantines the fingerprint: the request that caused it is not retried, and every request
// with the same fingerprint is refused until `ttl` after the quarantine began.
//
// A loss counts once per crash: losses of one fingerprint on the worker of an earlier counted
// loss, within kOneCrashWindow of it, are that crash again (identical requests in flight on one
// worker all end when it dies). So one crash never quarantines, whatever it held; the same
// worker lost again later (restarted, and crashed by the content again) counts anew.
//
// Bounded: at most `max_entries` fingerprints (losses and quarantines together) are kept; when
// full, the least recently touched entry is forgotten (an LRU), so a flood of distinct crashing
// requests costs memory O(max_entries) and at worst forgets the oldest suspects. Entries expire
// `ttl` after their last loss. Times are passed in, so tests drive the clock. Thread-safe.
#ifndef LAZYATTN_SERVICES_ROUTER_POLICY_QUERY_QUARANTINE_H_
#define LAZYATTN_SERVICES_ROUTER_POLICY_QUERY_QUARANTINE_H_

#include <atomic>
#include <cstdint>
#include <limits>
#include <list>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/document_key.h"

namespace lazyattn::router {

struct QuarantineOptions {
  absl::Duration ttl = absl::Seconds(300);  // zero: off (nothing is remembered or refused)
  int64_t max_entries = 10000;              // >= 1
  int losses_to_quarantine = 2;             // >= 1: connection losses that quarantine
};

// A 128-bit content fingerprint (request_fingerprint.h); DocumentKey's shape and hash.
using RequestFingerprint = DocumentKey;

// How one worker attempt ended, as far as the query-of-death rule cares.
struct AttemptEnd {
  bool unavailable = false;           // it ended UNAVAILABLE
  bool worker_headers = false;        // the worker's initial metadata arrived (the worker sends
                                      // it at once, so the request surely reached its process)
  bool worker_trailer = false;        // the worker's own end-of-call trailer came
  bool cancelled_by_router = false;   // the router cancelled it (client gone, first-token timeout)
};

// Whether the attempt counts as lost with its worker mid-call (RecordLoss): it reached the worker
// (its headers came) and then the transport ended it UNAVAILABLE, without the worker's trailer
// and without the router's cancellation. A READY channel at the start is not enough: a half-dead
// connection (host gone, keepalive not yet noticed) fails calls that never reached any process,
// and those must not quarantine innocent requests.
bool CountsAsLostMidCall(const AttemptEnd& end);

class QueryQuarantine {
 public:
  explicit QueryQuarantine(const QuarantineOptions& options) : options_(options) {}

  // Losses on one worker this close to its counted loss are one crash: the calls on one
  // connection end together when it dies, well within this; a restarted worker (process start,
  // model load, directory listing) is not back so soon.
  static constexpr absl::Duration kOneCrashWindow = absl::Seconds(2);

  // Records one attempt of `fingerprint` lost with the connection of worker `worker` (its id).
  // Returns true when this loss quarantined it (the caller logs, counts and stops retrying) or it
  // already was.
  bool RecordLoss(const RequestFingerprint& fingerprint, std::string_view worker, absl::Time now);
  // Whether requests with `fingerprint` are refused now; `until` (when not null) gets the end of
  // the quarantine.
  bool IsQuarantined(const RequestFingerprint& fingerprint, absl::Time now,
                     absl::Time* until = nullptr) const;
  // Whether any fingerprint may be quarantined at `now`: false once every quarantine has run out
  // (entries holding only losses, or expired ones not yet dropped, do not count). Lock-free and
  // O(1), so a request can skip fingerprinting while nothing is refused; true may be conservative
  // (an evicted quarantine counts until its end).
  bool AnyQuarantined(absl::Time now) const;
  // Entries kept now (losses and quarantines, expired ones not yet dropped included).
  int64_t size() const;
  const QuarantineOptions& options() const { return options_; }

 private:
  struct CountedLoss {
    std::string worker;
    absl::Time at;
  };
  struct Entry {
    int losses = 0;
    // The latest counted losses, at most losses_to_quarantine (enough to tell a repeat).
    std::vector<CountedLoss> counted;
    absl::Time expires = absl::InfinitePast();  // ttl after the last loss
    absl::Time quarantined_until = absl::InfinitePast();
    std::list<RequestFingerprint>::iterator lru;  // position in lru_ (front: most recent)
  };

  const QuarantineOptions options_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<RequestFingerprint, Entry> entries_ ABSL_GUARDED_BY(mu_);
  std::list<RequestFingerprint> lru_ ABSL_GUARDED_BY(mu_);
  // The latest quarantined_until ever set, in absl::ToUnixNanos (written under mu_).
  std::atomic<int64_t> latest_quarantine_end_ns_{std::numeric_limits<int64_t>::min()};
};

}  // namespace lazyattn::router

#endif  // LAZYATTN_SERVICES_ROUTER_POLICY_QUERY_QUARANTINE_H_
