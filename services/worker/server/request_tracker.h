// Engine requests running on behalf of RPCs, so that shutdown can refuse new ones and cancel the
// rest. Thread-safe; callers may hold their own lock while calling (this lock is innermost).
#ifndef LAZYATTN_SERVICES_WORKER_SERVER_REQUEST_TRACKER_H_
#define LAZYATTN_SERVICES_WORKER_SERVER_REQUEST_TRACKER_H_

#include <cstdint>
#include <mutex>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"

namespace lazyattn {

class RequestTracker {
 public:
  // False once draining: the caller cancels the engine request itself.
  bool Track(uint64_t engine_id) {
    std::lock_guard<std::mutex> lock(mu_);
    if (draining_) return false;
    ids_.insert(engine_id);
    return true;
  }
  void Untrack(uint64_t engine_id) {
    std::lock_guard<std::mutex> lock(mu_);
    ids_.erase(engine_id);
  }
  // From now on Track fails; returns the requests in flight (for the caller to cancel).
  std::vector<uint64_t> Drain() {
    std::lock_guard<std::mutex> lock(mu_);
    draining_ = true;
    return {ids_.begin(), ids_.end()};
  }
  bool draining() const {
    std::lock_guard<std::mutex> lock(mu_);
    return draining_;
  }
  size_t size() const {
    std::lock_guard<std::mutex> lock(mu_);
    return ids_.size();
  }

 private:
  mutable std::mutex mu_;
  absl::flat_hash_set<uint64_t> ids_ ABSL_GUARDED_BY(mu_);
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace lazyattn

#endif  // LAZYATTN_SERVICES_WORKER_SERVER_REQUEST_TRACKER_H_
