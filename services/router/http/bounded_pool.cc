#include "services/router/http/bounded_pool.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "services/router/http/guarded_server.h"

namespace lazyattn::router {

BoundedPool::BoundedPool(int threads, int max_queued,
                         std::shared_ptr<const std::atomic<bool>> stopping)
    : max_queued_(static_cast<size_t>(max_queued)),
      pool_threads_(static_cast<size_t>(threads)),
      stopping_(std::move(stopping)) {
  for (int i = 0; i < threads; ++i) workers_.emplace_back([this] { Run(&jobs_, false); });
  workers_.emplace_back([this] { Run(&shed_jobs_, true); });
  // Serve only once every pool thread waits for work: a connection that came before would find
  // no idle thread and, with max_queued 0, be shed (seen on a loaded machine).
  std::unique_lock<std::mutex> lock(mu_);
  started_cv_.wait(lock, [&] { return idle_ == pool_threads_; });
}

void BoundedPool::enqueue(std::function<void()> fn) {
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (jobs_.size() < max_queued_ + idle_) {
      jobs_.push_back(std::move(fn));
    } else {
      // At least one connection may always wait to be shed (max_queued 0 included). Polls
      // `stopping_`, which Server::stop() does not signal here.
      while (!space_cv_.wait_for(lock, std::chrono::milliseconds(100), [&] {
        return shutdown_ || stopping_->load() ||
               shed_jobs_.size() < std::max<size_t>(1, max_queued_);
      })) {
      }
      shed_jobs_.push_back(std::move(fn));
    }
  }
  cv_.notify_all();
}

void BoundedPool::shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    shutdown_ = true;
  }
  cv_.notify_all();
  space_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void BoundedPool::Run(std::deque<std::function<void()>>* queue, bool shed) {
  if (shed) ShedConnectionsOnThisThread();
  while (true) {
    std::function<void()> fn;
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (!shed && ++idle_ == pool_threads_) started_cv_.notify_all();
      cv_.wait(lock, [&] { return shutdown_ || !queue->empty(); });
      if (!shed) --idle_;
      if (queue->empty()) return;  // shutting down with nothing left
      fn = std::move(queue->front());
      queue->pop_front();
    }
    if (shed) space_cv_.notify_all();
    fn();
  }
}

}  // namespace lazyattn::router
