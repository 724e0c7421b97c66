#include "services/kvdir/server/slow_work_pool.h"

#include <utility>

namespace lazyattn::kvdir {

SlowWorkPool::SlowWorkPool(int threads) {
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Loop(); });
}

SlowWorkPool::~SlowWorkPool() {
  std::deque<Task> left;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    left.swap(queue_);
  }
  cv_.notify_all();
  for (std::thread& t : threads_) t.join();
  for (Task& task : left) task(/*stopping=*/true);
}

void SlowWorkPool::Run(Task task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stop_) {
      queue_.push_back(std::move(task));
      task = nullptr;
    }
  }
  if (task) {
    task(/*stopping=*/true);  // being destroyed: not queued, still run once
    return;
  }
  cv_.notify_one();
}

void SlowWorkPool::Loop() {
  while (true) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task(/*stopping=*/false);
  }
}

}  // namespace lazyattn::kvdir
