// Threads for the Publish messages whose handling takes long: a snapshot (converting and storing
// up to limits.max_entries_per_worker entries, ~250 ms at the bound) and a hello (a new epoch
// erases the worker's old entries). They must not run on gRPC's callback threads, which the
// Lookup handlers share: with as few of them as the host has cores, two snapshots at once kept
// every router's lookup (50 ms deadline) waiting after a kvdir restart.
//
// Each Publish stream has at most one task queued or running (its reactor reads the next message
// only once the task is done), so the queue is bounded by limits.max_publish_streams, each
// snapshot in it by limits.max_entries_per_worker. A worker whose snapshot waits or is applied
// here keeps its lease (DirectoryIndex::MessageQueued); a hello that waited past
// limits.hello_timeout_ms finds its stream cancelled and is dropped unapplied.
//
// Every task runs exactly once, on a pool thread, with `stopping` false, or, for a task still
// queued when the pool is destroyed (or given to Run meanwhile), with `stopping` true on the
// thread destroying it (or calling Run). Thread-safe. kvdir destroys it only after the gRPC
// server's Wait, when no stream is left to give it work.
#ifndef LAZYATTN_SERVICES_KVDIR_SERVER_SLOW_WORK_POOL_H_
#define LAZYATTN_SERVICES_KVDIR_SERVER_SLOW_WORK_POOL_H_

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"

namespace lazyattn::kvdir {

class SlowWorkPool {
 public:
  using Task = std::function<void(bool stopping)>;

  explicit SlowWorkPool(int threads);  // threads >= 1
  ~SlowWorkPool();                     // runs what is queued with stopping = true, joins
  SlowWorkPool(const SlowWorkPool&) = delete;
  SlowWorkPool& operator=(const SlowWorkPool&) = delete;

  void Run(Task task);

 private:
  void Loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> queue_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace lazyattn::kvdir

#endif  // LAZYATTN_SERVICES_KVDIR_SERVER_SLOW_WORK_POOL_H_
