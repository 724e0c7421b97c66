#include "services/worker/server/prep_pool.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "services/worker/server/handed_back.h"

namespace lazyattn {

absl::Status PrepPool::Validate(const PrepPoolOptions& o) {
  if (o.threads < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("engine.prep_threads: must be >= 1, got ", o.threads));
  }
  if (o.max_pending_bytes < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "engine.max_pending_preparation_bytes: must be >= 1, got ", o.max_pending_bytes));
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

absl::StatusOr<uint64_t> PrepPool::Submit(Task task, int64_t bytes) {
  uint64_t ticket;
  bytes = std::max<int64_t>(0, bytes);
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Nothing of the request was done: a router moves it without its retry budget.
    if (stop_) return HandedBack(absl::UnavailableError("worker shutting down"));
    if (static_cast<int>(queue_.size()) >= options_.max_pending) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "worker busy: ", queue_.size(), " requests wait for tokenization (",
          options_.threads, " threads, engine.max_pending_preparations ", options_.max_pending,
          "); retry later or elsewhere"));
    }
    if (!queue_.empty() && pending_bytes_ + bytes > options_.max_pending_bytes) {
      return absl::ResourceExhaustedError(
          absl::StrCat("worker busy: ", queue_.size(), " requests of ", pending_bytes_,
                       " bytes wait for tokenization, this one's ", bytes,
                       " would pass engine.max_pending_preparation_bytes ",
                       options_.max_pending_bytes, "; retry later or elsewhere"));
    }
    ticket = next_ticket_++;
    queue_.push_back({ticket, std::move(task), bytes});
    pending_bytes_ += bytes;
  }
  cv_.notify_one();
  return ticket;
}

bool PrepPool::Cancel(uint64_t ticket) {
  Task task;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = queue_.begin(); it != queue_.end(); ++it) {
      if (it->ticket != ticket) continue;
      task = std::move(it->task);
      pending_bytes_ -= it->bytes;
      queue_.erase(it);
      break;
    }
  }
  if (!task) return false;
  task(absl::CancelledError("cancelled while waiting for tokenization"));
  return true;
}

void PrepPool::Shutdown() {
  std::deque<Waiting> dropped;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    dropped.swap(queue_);
    pending_bytes_ = 0;
  }
  cv_.notify_all();
  for (Waiting& w : dropped) {
    w.task(HandedBack(absl::UnavailableError(
        "worker shutting down: draining, and the request had not started; retry it elsewhere")));
  }
  for (std::thread& t : threads_) {
    if (t.joinable()) t.join();
  }
}

int PrepPool::pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(queue_.size());
}

int64_t PrepPool::pending_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pending_bytes_;
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
    Task task = std::move(queue_.front().task);
    pending_bytes_ -= queue_.front().bytes;
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
