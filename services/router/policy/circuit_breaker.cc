#include "services/router/policy/circuit_breaker.h"

#include <algorithm>

#include "absl/container/flat_hash_set.h"

namespace lazyattn::router {

bool CircuitBreakers::AvailableLocked(const Entry& e, absl::Time now) const {
  if (!e.open) return true;
  if (now < e.open_until) return false;
  // Half-open: free unless a probe is out and not yet stale.
  return !e.probe_in_flight || now >= e.probe_started + options_.open_duration;
}

bool CircuitBreakers::Available(const std::string& worker, absl::Time now) const {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(worker);
  return it == entries_.end() || AvailableLocked(it->second, now);
}

CircuitBreakers::Permit CircuitBreakers::TryAcquire(const std::string& worker, absl::Time now) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(worker);
  if (it == entries_.end()) return Permit{.granted = true};
  Entry& e = it->second;
  if (!AvailableLocked(e, now)) return Permit{.generation = e.generation};
  if (e.open) {
    e.probe_in_flight = true;
    e.probe_started = now;
    ++e.probe_seq;
  }
  return Permit{
      .granted = true, .probe = e.open, .generation = e.generation, .probe_seq = e.probe_seq};
}

CircuitBreakers::Permit CircuitBreakers::Bypass(const std::string& worker) const {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(worker);
  return Permit{.granted = true, .generation = it == entries_.end() ? 0 : it->second.generation};
}

bool CircuitBreakers::CountOutcome(Entry& e, bool failed, absl::Time now) const {
  if (options_.failure_rate_percent <= 0) return false;
  const int64_t slice_ms =
      std::max<int64_t>(1, absl::ToInt64Milliseconds(options_.failure_rate_window) / kBuckets);
  const int64_t slice = absl::ToUnixMillis(now) / slice_ms;
  Bucket& bucket = e.window[static_cast<size_t>(((slice % kBuckets) + kBuckets) % kBuckets)];
  if (bucket.slice != slice) bucket = Bucket{.slice = slice};
  ++(failed ? bucket.failed : bucket.succeeded);
  if (!failed) return false;
  int64_t succeeded = 0, failures = 0;
  for (const Bucket& b : e.window) {
    if (b.slice > slice - kBuckets && b.slice <= slice) {
      succeeded += b.succeeded;
      failures += b.failed;
    }
  }
  const int64_t total = succeeded + failures;
  return total >= options_.failure_rate_min_requests &&
         static_cast<double>(failures) * 100 >=
             options_.failure_rate_percent * static_cast<double>(total);
}

void CircuitBreakers::Open(Entry& e, absl::Time now) {
  e.open = true;
  // From one counter for all workers: an entry forgotten by Retain and made again starts from
  // zero, and its openings must not match permits granted under the forgotten one's.
  e.generation = ++openings_;
  e.open_until = now + options_.open_duration;
  e.probe_in_flight = false;
  // The outcomes that opened it are spent; after the probe the worker starts a clean record.
  e.window = {};
}

void CircuitBreakers::RecordSuccess(const std::string& worker, const Permit& permit,
                                    absl::Time now) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(worker);
  if (it == entries_.end()) it = entries_.emplace(worker, Entry{}).first;
  Entry& e = it->second;
  if (e.open) {
    // Only a request sent since the breaker last opened speaks for the worker as it is now: the
    // probe, or one sent while every worker was out.
    if (permit.generation != e.generation) return;
    e.open = false;
    e.probe_in_flight = false;
    e.consecutive_failures = 0;
    e.window = {};
  } else if (permit.generation != e.generation) {
    return;  // sent before the breaker last opened: it says nothing of the worker since
  } else {
    e.consecutive_failures = 0;
  }
  CountOutcome(e, /*failed=*/false, now);
}

void CircuitBreakers::RecordFailure(const std::string& worker, const Permit& permit,
                                    absl::Time now) {
  absl::MutexLock lock(&mu_);
  Entry& e = entries_[worker];
  if (e.open) {
    // Already out. Only the probe's failure starts another period; the others (sent before it
    // opened, or while every worker was out) change nothing.
    if (permit.probe && permit.generation == e.generation) Open(e, now);
    return;
  }
  if (permit.generation != e.generation) return;  // sent before it last opened (and closed)
  ++e.consecutive_failures;
  const bool rate_opens = CountOutcome(e, /*failed=*/true, now);
  if (e.consecutive_failures >= options_.failure_threshold || rate_opens) Open(e, now);
}

void CircuitBreakers::Release(const std::string& worker, const Permit& permit) {
  if (!permit.probe) return;
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(worker);
  if (it != entries_.end() && it->second.generation == permit.generation &&
      it->second.probe_seq == permit.probe_seq) {
    it->second.probe_in_flight = false;
  }
}

void CircuitBreakers::Retain(const std::vector<std::string>& known) {
  const absl::flat_hash_set<std::string> keep(known.begin(), known.end());
  absl::MutexLock lock(&mu_);
  absl::erase_if(entries_, [&](const auto& entry) { return !keep.contains(entry.first); });
}

CircuitBreakers::State CircuitBreakers::StateOf(const std::string& worker, absl::Time now) const {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(worker);
  if (it == entries_.end() || !it->second.open) return State::kClosed;
  return now < it->second.open_until ? State::kOpen : State::kHalfOpen;
}

size_t CircuitBreakers::tracked_workers() const {
  absl::MutexLock lock(&mu_);
  return entries_.size();
}

}  // namespace lazyattn::router
