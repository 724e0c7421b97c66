#include "services/router/policy/query_quarantine.h"

#include <algorithm>

namespace lazyattn::router {

bool CountsAsLostMidCall(const AttemptEnd& end) {
  return end.unavailable && end.worker_headers && !end.worker_trailer && !end.cancelled_by_router;
}

bool QueryQuarantine::RecordLoss(const RequestFingerprint& fingerprint, std::string_view worker,
                                 absl::Time now) {
  if (options_.ttl <= absl::ZeroDuration()) return false;
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(fingerprint);
  if (it != entries_.end() && it->second.expires <= now) {
    // Its losses are older than the ttl: start over.
    lru_.erase(it->second.lru);
    entries_.erase(it);
    it = entries_.end();
  }
  if (it == entries_.end()) {
    while (static_cast<int64_t>(entries_.size()) >= std::max<int64_t>(1, options_.max_entries)) {
      entries_.erase(lru_.back());
      lru_.pop_back();
    }
    lru_.push_front(fingerprint);
    it = entries_.emplace(fingerprint, Entry{.lru = lru_.begin()}).first;
  } else {
    lru_.splice(lru_.begin(), lru_, it->second.lru);
  }
  Entry& e = it->second;
  e.expires = std::max(e.expires, now + options_.ttl);
  const bool same_crash = std::any_of(
      e.counted.begin(), e.counted.end(),
      [&](const CountedLoss& c) { return c.worker == worker && now - c.at < kOneCrashWindow; });
  if (same_crash) return e.quarantined_until > now;
  ++e.losses;
  if (static_cast<int>(e.counted.size()) >= std::max(1, options_.losses_to_quarantine)) {
    e.counted.erase(e.counted.begin());
  }
  e.counted.push_back({.worker = std::string(worker), .at = now});
  if (e.quarantined_until > now) return true;  // lost again while refused (a request in flight)
  if (e.losses < options_.losses_to_quarantine) return false;
  e.quarantined_until = now + options_.ttl;
  e.expires = std::max(e.expires, e.quarantined_until);
  const int64_t end_ns = absl::ToUnixNanos(e.quarantined_until);
  if (end_ns > latest_quarantine_end_ns_.load(std::memory_order_relaxed)) {
    latest_quarantine_end_ns_.store(end_ns, std::memory_order_release);
  }
  return true;
}

bool QueryQuarantine::IsQuarantined(const RequestFingerprint& fingerprint, absl::Time now,
                                    absl::Time* until) const {
  if (options_.ttl <= absl::ZeroDuration()) return false;
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(fingerprint);
  if (it == entries_.end() || it->second.quarantined_until <= now) return false;
  if (until != nullptr) *until = it->second.quarantined_until;
  return true;
}

bool QueryQuarantine::AnyQuarantined(absl::Time now) const {
  if (options_.ttl <= absl::ZeroDuration()) return false;
  return latest_quarantine_end_ns_.load(std::memory_order_acquire) > absl::ToUnixNanos(now);
}

int64_t QueryQuarantine::size() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(entries_.size());
}

}  // namespace lazyattn::router
