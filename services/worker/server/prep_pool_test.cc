#include "services/worker/server/prep_pool.h"

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/worker/server/handed_back.h"
#include "services/worker/server/prep_ticket.h"

namespace lazyattn {
namespace {

using ::testing::HasSubstr;

// A task that records how it was called and, when called with OK, blocks until released.
struct Probe {
  absl::Notification started;
  absl::Notification release;
  absl::Notification done;
  absl::Status status = absl::UnknownError("not called");
  std::thread::id thread;
  std::atomic<int> calls{0};

  PrepPool::Task Task() {
    return [this](const absl::Status& s) {
      ++calls;
      status = s;
      thread = std::this_thread::get_id();
      if (s.ok()) {
        started.Notify();
        release.WaitForNotification();
      }
      done.Notify();
    };
  }
};

TEST(PrepPoolTest, RunsTasksOnItsOwnThreads) {
  PrepPool pool({.threads = 2, .max_pending = 4});
  Probe a;
  a.release.Notify();
  ASSERT_TRUE(pool.Submit(a.Task()).ok());
  a.done.WaitForNotification();
  EXPECT_TRUE(a.status.ok());
  EXPECT_NE(a.thread, std::this_thread::get_id());
  EXPECT_EQ(a.calls.load(), 1);
}

TEST(PrepPoolTest, FullQueueIsRefusedAtOnce) {
  PrepPool pool({.threads = 1, .max_pending = 2});
  Probe running, queued1, queued2, refused;
  ASSERT_TRUE(pool.Submit(running.Task()).ok());
  running.started.WaitForNotification();  // the only thread is busy
  ASSERT_TRUE(pool.Submit(queued1.Task()).ok());
  ASSERT_TRUE(pool.Submit(queued2.Task()).ok());
  EXPECT_EQ(pool.pending(), 2);
  EXPECT_EQ(pool.running(), 1);
  auto third = pool.Submit(refused.Task());
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(third.status().message()),
              HasSubstr("engine.max_pending_preparations 2"));
  running.release.Notify();
  queued1.release.Notify();
  queued2.release.Notify();
  queued2.done.WaitForNotification();
  EXPECT_TRUE(queued1.status.ok());
  EXPECT_TRUE(queued2.status.ok());
  EXPECT_EQ(refused.calls.load(), 0);  // a refused task is never called
}

// The waiting requests' bytes are bounded too: a request that would pass max_pending_bytes is
// refused at once naming the option, one of any size is taken while none waits (a single large
// request is served), and bytes leave the count as their tasks start or are cancelled.
TEST(PrepPoolTest, WaitingBytesAreBounded) {
  PrepPool pool({.threads = 1, .max_pending = 8, .max_pending_bytes = 1000});
  Probe running, big, refused, small, over;
  ASSERT_TRUE(pool.Submit(running.Task(), 5000).ok());  // runs at once: counts nothing waiting
  running.started.WaitForNotification();
  EXPECT_EQ(pool.pending_bytes(), 0);
  auto big_ticket = pool.Submit(big.Task(), 1500);  // alone in the queue: taken whatever its size
  ASSERT_TRUE(big_ticket.ok());
  EXPECT_EQ(pool.pending_bytes(), 1500);
  auto second = pool.Submit(refused.Task(), 1);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(second.status().message()),
              HasSubstr("engine.max_pending_preparation_bytes 1000"));
  EXPECT_EQ(refused.calls.load(), 0);
  // Cancelling a waiting task gives its bytes back.
  ASSERT_TRUE(pool.Cancel(*big_ticket));
  EXPECT_EQ(pool.pending_bytes(), 0);
  EXPECT_EQ(big.status.code(), absl::StatusCode::kCancelled);
  ASSERT_TRUE(pool.Submit(small.Task(), 900).ok());
  EXPECT_FALSE(pool.Submit(over.Task(), 200).ok());  // 900 + 200 > 1000
  // A task that starts takes its bytes out of the count.
  small.release.Notify();
  running.release.Notify();
  small.done.WaitForNotification();
  EXPECT_TRUE(small.status.ok());
  EXPECT_EQ(pool.pending_bytes(), 0);
  EXPECT_EQ(over.calls.load(), 0);
}

TEST(PrepPoolTest, CancelTakesAQueuedTaskOutAndFreesItsSlot) {
  PrepPool pool({.threads = 1, .max_pending = 1});
  Probe running, queued, next;
  ASSERT_TRUE(pool.Submit(running.Task()).ok());
  running.started.WaitForNotification();
  auto ticket = pool.Submit(queued.Task());
  ASSERT_TRUE(ticket.ok());
  EXPECT_EQ(pool.Submit(next.Task()).status().code(), absl::StatusCode::kResourceExhausted);

  EXPECT_TRUE(pool.Cancel(*ticket));
  // Called at once, on this thread, with Cancelled.
  EXPECT_EQ(queued.calls.load(), 1);
  EXPECT_EQ(queued.status.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(queued.thread, std::this_thread::get_id());
  EXPECT_EQ(pool.pending(), 0);
  EXPECT_FALSE(pool.Cancel(*ticket));  // only once

  Probe again;
  auto t2 = pool.Submit(again.Task());  // the slot is free again
  ASSERT_TRUE(t2.ok());
  running.release.Notify();
  again.release.Notify();
  again.done.WaitForNotification();
  EXPECT_TRUE(again.status.ok());
  EXPECT_EQ(queued.calls.load(), 1);  // the cancelled task never ran
}

TEST(PrepPoolTest, CancelDoesNotTouchARunningTask) {
  PrepPool pool({.threads = 1, .max_pending = 1});
  Probe running;
  auto ticket = pool.Submit(running.Task());
  ASSERT_TRUE(ticket.ok());
  running.started.WaitForNotification();
  EXPECT_FALSE(pool.Cancel(*ticket));
  running.release.Notify();
  running.done.WaitForNotification();
  EXPECT_TRUE(running.status.ok());
  EXPECT_EQ(running.calls.load(), 1);
}

TEST(PrepPoolTest, ShutdownEndsQueuedTasksAndRefusesNewOnes) {
  auto pool = std::make_unique<PrepPool>(PrepPoolOptions{.threads = 1, .max_pending = 4});
  Probe running, queued;
  ASSERT_TRUE(pool->Submit(running.Task()).ok());
  running.started.WaitForNotification();
  ASSERT_TRUE(pool->Submit(queued.Task()).ok());
  std::thread releaser([&] {
    queued.done.WaitForNotification();  // Shutdown ends the queued task before it joins
    running.release.Notify();
  });
  pool->Shutdown();
  releaser.join();
  EXPECT_EQ(queued.status.code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(IsHandedBack(queued.status)) << "nothing of it was done: a router may move it";
  EXPECT_TRUE(running.status.ok());
  Probe late;
  const absl::Status refused = pool->Submit(late.Task()).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(IsHandedBack(refused));
  pool.reset();  // Shutdown again: idempotent
  EXPECT_EQ(late.calls.load(), 0);
}

TEST(PrepPoolTest, ValidateNamesTheOption) {
  EXPECT_THAT(std::string(PrepPool::Validate({.threads = 0}).message()),
              HasSubstr("engine.prep_threads"));
  EXPECT_THAT(std::string(PrepPool::Validate({.threads = 1, .max_pending = 0}).message()),
              HasSubstr("engine.max_pending_preparations"));
  EXPECT_THAT(std::string(PrepPool::Validate({.max_pending_bytes = 0}).message()),
              HasSubstr("engine.max_pending_preparation_bytes"));
  EXPECT_TRUE(PrepPool::Validate({}).ok());
}


// PrepTicket (prep_ticket.h): a cancellation reaches the call's task whenever it comes.
namespace prep_ticket_test {

struct Recorder {
  std::atomic<int> calls{0};
  absl::Status status = absl::UnknownError("not called");
  absl::Notification done;
  PrepTicket* ticket = nullptr;
  PrepPool::Task Task() {
    return [this](const absl::Status& s) {
      status = ticket->Start(s);
      ++calls;
      done.Notify();
    };
  }
};

TEST(PrepTicketTest, CancelWhileQueuedRunsTheTaskCancelledAtOnce) {
  PrepPool pool({.threads = 1, .max_pending = 4});
  Probe blocker;
  ASSERT_TRUE(pool.Submit(blocker.Task()).ok());
  blocker.started.WaitForNotification();
  PrepTicket ticket(&pool);
  Recorder r{.ticket = &ticket};
  ASSERT_TRUE(ticket.Submit(r.Task()).ok());
  EXPECT_EQ(pool.pending(), 1);
  ticket.Cancel();
  EXPECT_EQ(r.calls.load(), 1);  // on this thread, before Cancel returned
  EXPECT_EQ(r.status.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(pool.pending(), 0);
  ticket.Cancel();  // idempotent
  EXPECT_EQ(r.calls.load(), 1);
  blocker.release.Notify();
}

TEST(PrepTicketTest, CancelBeforeSubmitIsAppliedWhenTheTicketIsKnown) {
  PrepPool pool({.threads = 1, .max_pending = 4});
  Probe blocker;
  ASSERT_TRUE(pool.Submit(blocker.Task()).ok());
  blocker.started.WaitForNotification();
  PrepTicket ticket(&pool);
  Recorder r{.ticket = &ticket};
  ticket.Cancel();  // e.g. the client went away before the call was queued
  ASSERT_TRUE(ticket.Submit(r.Task()).ok());
  EXPECT_EQ(r.calls.load(), 1);
  EXPECT_EQ(r.status.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(pool.pending(), 0);  // its queue slot is free again
  blocker.release.Notify();
}

TEST(PrepTicketTest, CancelAfterAThreadTookItIsReportedByStart) {
  PrepPool pool({.threads = 1, .max_pending = 4});
  PrepTicket ticket(&pool);
  absl::Notification taken, cancelled;
  absl::Status started;
  ASSERT_TRUE(ticket
                  .Submit([&](const absl::Status& s) {
                    taken.Notify();
                    cancelled.WaitForNotification();
                    started = ticket.Start(s);
                  })
                  .ok());
  taken.WaitForNotification();
  ticket.Cancel();  // too late to take it out of the queue
  cancelled.Notify();
  pool.Shutdown();  // waits for the task
  EXPECT_EQ(started.code(), absl::StatusCode::kCancelled);
}

TEST(PrepTicketTest, UncancelledTaskStartsWithThePoolStatus) {
  PrepPool pool({.threads = 1, .max_pending = 4});
  PrepTicket ticket(&pool);
  Recorder r{.ticket = &ticket};
  ASSERT_TRUE(ticket.Submit(r.Task()).ok());
  r.done.WaitForNotification();
  EXPECT_TRUE(r.status.ok()) << r.status;
  ticket.Cancel();  // after the start: nothing to take out, no second call
  EXPECT_EQ(r.calls.load(), 1);
}

TEST(PrepTicketTest, FullPoolRefusesAndNeverCallsTheTask) {
  PrepPool pool({.threads = 1, .max_pending = 1});
  Probe blocker, queued;
  ASSERT_TRUE(pool.Submit(blocker.Task()).ok());
  blocker.started.WaitForNotification();
  ASSERT_TRUE(pool.Submit(queued.Task()).ok());
  PrepTicket ticket(&pool);
  Recorder r{.ticket = &ticket};
  EXPECT_EQ(ticket.Submit(r.Task()).code(), absl::StatusCode::kResourceExhausted);
  ticket.Cancel();
  EXPECT_EQ(r.calls.load(), 0);
  blocker.release.Notify();
  queued.release.Notify();
  pool.Shutdown();  // the probes, declared after the pool, go first: their tasks must be done
}

}  // namespace prep_ticket_test
}  // namespace
}  // namespace lazyattn
