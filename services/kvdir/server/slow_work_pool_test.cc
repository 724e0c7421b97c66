#include "services/kvdir/server/slow_work_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <thread>

#include "absl/synchronization/notification.h"

namespace lazyattn::kvdir {
namespace {

TEST(SlowWorkPoolTest, RunsEveryTaskOnceOnItsThreads) {
  std::atomic<int> ran{0}, stopping{0};
  const std::thread::id caller = std::this_thread::get_id();
  std::atomic<int> on_caller{0};
  {
    SlowWorkPool pool(2);
    for (int i = 0; i < 100; ++i) {
      pool.Run([&](bool stop) {
        ++ran;
        stopping += stop;
        on_caller += std::this_thread::get_id() == caller;
      });
    }
    while (ran < 100) std::this_thread::yield();
  }
  EXPECT_EQ(ran, 100);
  EXPECT_EQ(stopping, 0);
  EXPECT_EQ(on_caller, 0);
}

// What is still queued when the pool goes runs once, told it is stopping: a Publish stream
// waiting for its snapshot is ended, never left without an answer.
TEST(SlowWorkPoolTest, TasksQueuedAtDestructionRunOnceStopping) {
  absl::Notification started, release;
  std::atomic<int> ran{0};
  auto pool = std::make_unique<SlowWorkPool>(1);
  pool->Run([&](bool) {
    started.Notify();
    release.WaitForNotification();
    ++ran;
  });
  started.WaitForNotification();
  for (int i = 0; i < 3; ++i) {
    pool->Run([&](bool) { ++ran; });
  }
  std::thread destroyer([&] { pool.reset(); });
  release.Notify();
  destroyer.join();
  // Each exactly once, whether a pool thread took it before the destructor emptied the queue
  // (the order of the two is up to the threads) or the destructor ran it.
  EXPECT_EQ(ran, 4);
}

}  // namespace
}  // namespace lazyattn::kvdir
