#include "services/router/policy/circuit_breaker.h"

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

bool CircuitBreakers::TryAcquire(const std::string& worker, absl::Time now) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(worker);
  if (it == entries_.end()) return true;
  Entry& e = it->second;
  if (!AvailableLocked(e, now)) return false;
  if (e.open) {
    e.probe_in_flight = true;
    e.probe_started = now;
  }
  return true;
}

void CircuitBreakers::RecordSuccess(const std::string& worker) {
  absl::MutexLock lock(&mu_);
  entries_.erase(worker);
}

void CircuitBreakers::RecordFailure(const std::string& worker, absl::Time now) {
  absl::MutexLock lock(&mu_);
  Entry& e = entries_[worker];
  ++e.consecutive_failures;
  if (e.open || e.consecutive_failures >= options_.failure_threshold) {
    // A failed probe (or the threshold reached): out for another period.
    e.open = true;
    e.open_until = now + options_.open_duration;
    e.probe_in_flight = false;
  }
}

void CircuitBreakers::Release(const std::string& worker) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(worker);
  if (it != entries_.end()) it->second.probe_in_flight = false;
}

CircuitBreakers::State CircuitBreakers::StateOf(const std::string& worker, absl::Time now) const {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(worker);
  if (it == entries_.end() || !it->second.open) return State::kClosed;
  return now < it->second.open_until ? State::kOpen : State::kHalfOpen;
}

}  // namespace lazyattn::router
