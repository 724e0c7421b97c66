#include "services/worker/server/prep_pool.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace lazyattn {

absl::Status PrepPool::Validate(const PrepPoolOptions& o) {
  if (o.threads < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("engine.prep_threads: must be >= 1, got ", o.threads));
  }
  if (o.max_pending < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("engine.max_pending_preparations: must be >= 1, got ", o.max_pending));
  }
  return absl::OkStatus();
}

PrepPool::PrepPool(const PrepPoolOptions& options) : options_(options) {
  threads_.reserve(options_.threads);
  // At least one thread even for options Validate refuses: a queued task must always run.
  for (int i = 0; i < std::max(1, options_.threads); ++i) {
    threads_.emplace_back([this] { Loop(); });
  }
}

PrepPool::~PrepPool() { Shutdown(); }

absl::StatusOr<uint64_t> PrepPool::Submit(Task task) {
  uint64_t ticket;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return absl::UnavailableError("worker shutting down");
    if (static_cast<int>(queue_.size()) >= options_.max_pending) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "worker busy: ", queue_.size(), " requests wait for tokenization (",
          options_.threads, " threads, engine.max_pending_preparations ", options_.max_pending,
          "); retry later or elsewhere"));
    }
    ticket = next_ticket_++;
    queue_.emplace_back(ticket, std::move(task));
  }
  cv_.notify_one();
  return ticket;
}

bool PrepPool::Cancel(uint64_t ticket) {
  Task task;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = queue_.begin(); it != queue_.end(); ++it) {
      if (it->first != ticket) continue;
      task = std::move(it->second);
      queue_.erase(it);
      break;
    }
  }
  if (!task) return false;
  task(absl::CancelledError("cancelled while waiting for tokenization"));
  return true;
}

void PrepPool::Shutdown() {
  std::deque<std::pair<uint64_t, Task>> dropped;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    dropped.swap(queue_);
  }
  cv_.notify_all();
  for (auto& [ticket, task] : dropped) task(absl::UnavailableError("worker shutting down"));
  for (std::thread& t : threads_) {
    if (t.joinable()) t.join();
  }
}

int PrepPool::pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(queue_.size());
}

int PrepPool::running() const {
  std::lock_guard<std::mutex> lock(mu_);
  return running_;
}

void PrepPool::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, nothing left
    Task task = std::move(queue_.front().second);
    queue_.pop_front();
    ++running_;
    lock.unlock();
    task(absl::OkStatus());
    task = nullptr;  // what it captured goes before the count says it ended
    lock.lock();
    --running_;
  }
}

}  // namespace lazyattn
