#include "services/router/policy/lookup_gate.h"

#include <algorithm>

namespace lazyattn::router {

LookupGate::Decision LookupGate::Decide(absl::Time now) {
  absl::MutexLock lock(&mu_);
  if (!skipping_) return Decision::kLookUp;
  // A trial's outcome always comes (its callback runs once, by its deadline at the latest), so
  // one in flight needs no expiry of its own.
  if (now < skip_until_ || trial_in_flight_) return Decision::kSkip;
  trial_in_flight_ = true;
  return Decision::kTrial;
}

bool LookupGate::Record(bool answered, bool trial, absl::Time now) {
  absl::MutexLock lock(&mu_);
  if (skipping_) {
    if (!trial) return false;  // sent before the gate closed
    trial_in_flight_ = false;
    if (answered) {
      skipping_ = false;
      consecutive_failures_ = 0;
      backoff_ = absl::ZeroDuration();
      return true;
    }
    backoff_ = std::min(backoff_ * 2, options_.max_backoff);
    skip_until_ = now + backoff_;
    return false;
  }
  if (answered) {
    consecutive_failures_ = 0;
    return false;
  }
  ++consecutive_failures_;
  if (options_.failures_to_skip <= 0 || consecutive_failures_ < options_.failures_to_skip) {
    return false;
  }
  skipping_ = true;
  backoff_ = options_.base_backoff;
  skip_until_ = now + backoff_;
  return true;
}

void LookupGate::TrialNow(absl::Time now) {
  absl::MutexLock lock(&mu_);
  if (skipping_) skip_until_ = std::min(skip_until_, now);
}

bool LookupGate::skipping() const {
  absl::MutexLock lock(&mu_);
  return skipping_;
}

absl::Duration LookupGate::backoff() const {
  absl::MutexLock lock(&mu_);
  return backoff_;
}

}  // namespace lazyattn::router
