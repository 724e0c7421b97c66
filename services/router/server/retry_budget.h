// A retry budget, as Envoy's (circuit breakers' retry_budget): the failover attempts in flight
// are at most max(min_retries, percent % of the requests in flight). When many workers fail at
// once, every request that lost its worker would otherwise try the next one, and the survivors
// would take the whole load twice over (a retry storm). Over budget, a request ends with its
// failure instead of failing over (forwarding_call.h); routing.max_attempts still bounds each
// request alone.
//
// Slots are RAII: a RequestSlot counts one request in flight for its life, a RetrySlot one
// failover attempt. Thread-safe; the budget must outlive its slots.
#ifndef LAZYATTN_SERVICES_ROUTER_SERVER_RETRY_BUDGET_H_
#define LAZYATTN_SERVICES_ROUTER_SERVER_RETRY_BUDGET_H_

#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace lazyattn::router {

struct RetryBudgetOptions {
  double percent = 20.0;  // of the requests in flight (routing.retry_budget_percent; Envoy's 20)
  int min_retries = 3;    // retries always allowed at once (routing.retry_budget_min; Envoy's 3)
};

class RetryBudget {
 public:
  explicit RetryBudget(RetryBudgetOptions options) : options_(options) {}

  class RequestSlot;
  class RetrySlot;

  // Counts a request in flight until the slot is destroyed.
  RequestSlot StartRequest();
  // A failover attempt, counted until the slot is destroyed or reset; an empty slot (held()
  // false) when the budget is spent.
  RetrySlot TryStartRetry();

  // Failover attempts the budget allows now, and those in flight.
  int64_t allowed() const;
  int64_t retries_in_flight() const;

 private:
  int64_t AllowedLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EndRequest();
  void EndRetry();

  const RetryBudgetOptions options_;
  mutable absl::Mutex mu_;
  int64_t requests_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t retries_ ABSL_GUARDED_BY(mu_) = 0;
};

class RetryBudget::RequestSlot {
 public:
  RequestSlot() = default;
  RequestSlot(RequestSlot&& other) noexcept : budget_(other.budget_) { other.budget_ = nullptr; }
  RequestSlot& operator=(RequestSlot&& other) noexcept;
  ~RequestSlot() { Reset(); }
  void Reset();

 private:
  friend class RetryBudget;
  explicit RequestSlot(RetryBudget* budget) : budget_(budget) {}
  RetryBudget* budget_ = nullptr;
};

class RetryBudget::RetrySlot {
 public:
  RetrySlot() = default;
  RetrySlot(RetrySlot&& other) noexcept : budget_(other.budget_) { other.budget_ = nullptr; }
  RetrySlot& operator=(RetrySlot&& other) noexcept;
  ~RetrySlot() { Reset(); }
  bool held() const { return budget_ != nullptr; }
  void Reset();

 private:
  friend class RetryBudget;
  explicit RetrySlot(RetryBudget* budget) : budget_(budget) {}
  RetryBudget* budget_ = nullptr;
};

}  // namespace lazyattn::router

#endif  // LAZYATTN_SERVICES_ROUTER_SERVER_RETRY_BUDGET_H_
