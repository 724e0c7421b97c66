#include "services/router/server/retry_budget.h"

#include <algorithm>
#include <cmath>

namespace lazyattn::router {

RetryBudget::RequestSlot RetryBudget::StartRequest() {
  absl::MutexLock lock(&mu_);
  ++requests_;
  return RequestSlot(this);
}

RetryBudget::RetrySlot RetryBudget::TryStartRetry() {
  absl::MutexLock lock(&mu_);
  if (retries_ >= AllowedLocked()) return RetrySlot();
  ++retries_;
  return RetrySlot(this);
}

int64_t RetryBudget::AllowedLocked() const {
  // percent x requests first: percent / 100 is inexact (0.29 x 100 = 28.999...), the product of
  // whole numbers is not.
  const double share = std::floor(options_.percent * static_cast<double>(requests_) / 100.0);
  return std::max<int64_t>(options_.min_retries, static_cast<int64_t>(share));
}

int64_t RetryBudget::allowed() const {
  absl::MutexLock lock(&mu_);
  return AllowedLocked();
}

int64_t RetryBudget::retries_in_flight() const {
  absl::MutexLock lock(&mu_);
  return retries_;
}

void RetryBudget::EndRequest() {
  absl::MutexLock lock(&mu_);
  --requests_;
}

void RetryBudget::EndRetry() {
  absl::MutexLock lock(&mu_);
  --retries_;
}

RetryBudget::RequestSlot& RetryBudget::RequestSlot::operator=(RequestSlot&& other) noexcept {
  if (this != &other) {
    Reset();
    budget_ = other.budget_;
    other.budget_ = nullptr;
  }
  return *this;
}

void RetryBudget::RequestSlot::Reset() {
  if (budget_ != nullptr) budget_->EndRequest();
  budget_ = nullptr;
}

RetryBudget::RetrySlot& RetryBudget::RetrySlot::operator=(RetrySlot&& other) noexcept {
  if (this != &other) {
    Reset();
    budget_ = other.budget_;
    other.budget_ = nullptr;
  }
  return *this;
}

void RetryBudget::RetrySlot::Reset() {
  if (budget_ != nullptr) budget_->EndRetry();
  budget_ = nullptr;
}

}  // namespace lazyattn::router
