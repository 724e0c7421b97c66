// The HTTP listener's connection pool (a cpp-httplib TaskQueue). cpp-httplib runs each
// connection as one task to its end (keep-alive included). This pool caps the tasks running
// (`threads`) and waiting (`max_queued`); a connection beyond both waits in a second queue, as
// bounded (`max_queued`), for one extra thread that answers each 503 at once, without reading its
// request (ShedConnectionsOnThisThread, guarded_server.h), so a slow client there delays no other.
// When that queue is full too, enqueue() blocks the accepting thread: cpp-httplib 0.11 gives the
// pool no way to close a socket it will not serve (the socket is inside the task), so further
// connections wait in the kernel's accept backlog instead, holding no file descriptor of the
// process. The open sockets are thus at most threads + 2 * max_queued.
#ifndef LAZYATTN_SERVICES_ROUTER_HTTP_BOUNDED_POOL_H_
#define LAZYATTN_SERVICES_ROUTER_HTTP_BOUNDED_POOL_H_

#include <httplib.h>

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace lazyattn::router {

class BoundedPool final : public httplib::TaskQueue {
 public:
  // Starts `threads` pool threads and the shedding thread, and returns once every pool thread
  // waits for work. `stopping`: set when the server stops; an enqueue() waiting for room then
  // queues anyway.
  BoundedPool(int threads, int max_queued, std::shared_ptr<const std::atomic<bool>> stopping);
  ~BoundedPool() override = default;

  void enqueue(std::function<void()> fn) override;
  // Runs what is queued, then joins every thread.
  void shutdown() override;

 private:
  void Run(std::deque<std::function<void()>>* queue, bool shed);

  const size_t max_queued_;
  const size_t pool_threads_;  // not counting the shedding thread
  std::mutex mu_;
  std::condition_variable cv_;          // a job was queued, or shutdown
  std::condition_variable space_cv_;    // the shed queue has room, or stopping
  std::condition_variable started_cv_;  // every pool thread waits for work (the constructor's)
  std::deque<std::function<void()>> jobs_, shed_jobs_;
  size_t idle_ = 0;  // pool threads waiting for a job
  const std::shared_ptr<const std::atomic<bool>> stopping_;
  bool shutdown_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace lazyattn::router

#endif  // LAZYATTN_SERVICES_ROUTER_HTTP_BOUNDED_POOL_H_
