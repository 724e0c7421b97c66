// A small pool of threads for request preparation: validating, tokenizing and hashing a request's
// documents (up to 64 x 1 MiB) costs tens of milliseconds and must not run on gRPC's callback
// threads, which every call of the server shares. Bounded: at most `max_pending` tasks wait, and
// their requests' bytes total at most `max_pending_bytes` (a waiting request holds its message
// and its converted copy: 64 of the largest would take gigabytes); Submit refuses the next one at
// once with RESOURCE_EXHAUSTED (the router then tries another worker), so a flood of large
// requests cannot queue without limit. A task is taken whatever its size while none waits.
//
// Every accepted task is called exactly once with a status saying what to do:
//   OK           on a pool thread: do the work now;
//   Cancelled    on the thread that called Cancel, which removed it from the queue;
//   Unavailable  on the thread that called Shutdown (or destroyed the pool) before it ran.
// A task is never called with the pool's lock held: it may call Submit or Cancel itself.
//
// Thread-safe. Shutdown (also run by the destructor) waits for running tasks to return.
#ifndef LAZYATTN_SERVICES_WORKER_SERVER_PREP_POOL_H_
#define LAZYATTN_SERVICES_WORKER_SERVER_PREP_POOL_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace lazyattn {

struct PrepPoolOptions {
  int threads = 2;       // YAML engine.prep_threads
  int max_pending = 64;  // tasks waiting for a thread; YAML engine.max_pending_preparations
  // Bytes of the waiting tasks' requests; YAML engine.max_pending_preparation_bytes.
  int64_t max_pending_bytes = int64_t{256} << 20;
};

class PrepPool {
 public:
  using Task = std::function<void(const absl::Status& status)>;

  // InvalidArgument naming the option when threads or max_pending is below 1.
  static absl::Status Validate(const PrepPoolOptions& options);
  // Starts the threads. Options must be valid (Validate).
  explicit PrepPool(const PrepPoolOptions& options);
  ~PrepPool();
  PrepPool(const PrepPool&) = delete;
  PrepPool& operator=(const PrepPool&) = delete;

  // Queues `task`, whose request is `bytes` long, and returns its ticket (for Cancel).
  // ResourceExhausted when max_pending tasks already wait or their bytes and these would pass
  // max_pending_bytes, Unavailable after Shutdown; in every case `task` is never called.
  absl::StatusOr<uint64_t> Submit(Task task, int64_t bytes = 0);
  // Takes the task out of the queue and calls it with Cancelled (on this thread, before
  // returning true). False when it already started, ended or was never queued.
  bool Cancel(uint64_t ticket);
  // Refuses new tasks, calls every waiting one with Unavailable, waits for running ones.
  // Idempotent.
  void Shutdown();

  int pending() const;  // waiting for a thread
  int64_t pending_bytes() const;  // their requests' bytes
  int running() const;  // being run now
  const PrepPoolOptions& options() const { return options_; }

 private:
  void Loop();

  const PrepPoolOptions options_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  struct Waiting {
    uint64_t ticket;
    Task task;
    int64_t bytes;
  };
  std::deque<Waiting> queue_ ABSL_GUARDED_BY(mu_);
  int64_t pending_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_ticket_ ABSL_GUARDED_BY(mu_) = 1;
  int running_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace lazyattn

#endif  // LAZYATTN_SERVICES_WORKER_SERVER_PREP_POOL_H_
