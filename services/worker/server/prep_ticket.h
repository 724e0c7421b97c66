// One call's place in the PrepPool, shared by GenerateReactor and PrefetchReactor: queued,
// started, or cancelled, whatever order the pool's thread and the call's cancellation (the client,
// its deadline, a slow client) arrive in.
//
//   Submit  queues the task and records its ticket. A Cancel that came before the ticket was
//           recorded is applied right after, so no cancellation is ever lost to that window.
//   Cancel  takes a task that still waits out of the queue (the pool then runs it with Cancelled,
//           on this thread, before Cancel returns); for a task already taken by a pool thread it
//           leaves a mark that Start reports. Idempotent.
//   Start   the task's first act: its pool status, or Cancelled when a Cancel came first.
//
// After Start the caller owns cancellation (it has the engine request's id, or will have).
// Thread-safe: its own lock, never held while calling the pool, because the pool may run the task
// inside Cancel and the task takes the caller's locks. Callers must not hold a lock the task takes
// while calling Submit or Cancel.
#ifndef LAZYATTN_SERVICES_WORKER_SERVER_PREP_TICKET_H_
#define LAZYATTN_SERVICES_WORKER_SERVER_PREP_TICKET_H_

#include <cstdint>
#include <mutex>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "services/worker/server/prep_pool.h"

namespace lazyattn {

class PrepTicket {
 public:
  explicit PrepTicket(PrepPool* pool) : pool_(pool) {}
  PrepTicket(const PrepTicket&) = delete;
  PrepTicket& operator=(const PrepTicket&) = delete;

  // PrepPool::Submit's errors (ResourceExhausted, Unavailable); the task is then never called.
  // Call at most once.
  absl::Status Submit(PrepPool::Task task, int64_t bytes = 0);
  void Cancel();
  absl::Status Start(const absl::Status& pool_status);

 private:
  PrepPool* const pool_;
  std::mutex mu_;
  uint64_t ticket_ ABSL_GUARDED_BY(mu_) = 0;  // while queued, else 0
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace lazyattn

#endif  // LAZYATTN_SERVICES_WORKER_SERVER_PREP_TICKET_H_
