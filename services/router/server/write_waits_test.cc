// WriteWaits on a made-up clock: what counts against a call's write wait budget.
#include "services/router/server/write_waits.h"

#include <gtest/gtest.h>

namespace lazyattn::router {
namespace {

constexpr int64_t kMs = 1'000'000;

TEST(WriteWaitsTest, EachWritesFirstFiveMillisecondsAreNotCounted) {
  WriteWaits w;
  EXPECT_EQ(w.At(100 * kMs).counted_ns, 0);  // no write yet
  w.Started(2 * kMs, 0);
  EXPECT_EQ(w.At(5 * kMs).current_ns, 3 * kMs);
  EXPECT_EQ(w.At(5 * kMs).counted_ns, 0);
  EXPECT_EQ(w.At(14 * kMs).counted_ns, 7 * kMs);  // in progress: counted as it goes
  w.Done(14 * kMs);
  EXPECT_EQ(w.At(50 * kMs).current_ns, 0);
  EXPECT_EQ(w.At(50 * kMs).counted_ns, 7 * kMs);
  // A thousand writes that wait 4 ms each (a busy router, a client keeping up) count nothing.
  for (int i = 0; i < 1000; ++i) {
    w.Started(100 * kMs + i * 10 * kMs, 0);
    w.Done(104 * kMs + i * 10 * kMs);
  }
  EXPECT_EQ(w.At(20'000 * kMs).counted_ns, 7 * kMs);
  // Done without a write started is nothing.
  w.Done(30'000 * kMs);
  EXPECT_EQ(w.At(30'000 * kMs).counted_ns, 7 * kMs);
}

TEST(WriteWaitsTest, AWriteWaitsOnlyOnceItsAllowanceIsOver) {
  WriteWaits w;
  w.Started(0, 1000 * kMs);  // a large answer: its bytes at the minimum rate take a second
  EXPECT_EQ(w.At(900 * kMs).current_ns, 0);
  EXPECT_EQ(w.At(900 * kMs).counted_ns, 0);
  EXPECT_EQ(w.At(1010 * kMs).current_ns, 10 * kMs);
  EXPECT_EQ(w.At(1010 * kMs).counted_ns, 5 * kMs);
  w.Done(1020 * kMs);
  EXPECT_EQ(w.At(2000 * kMs).counted_ns, 15 * kMs);
  // Done inside the allowance counts nothing; a negative allowance is none.
  w.Started(3000 * kMs, 500 * kMs);
  w.Done(3200 * kMs);
  EXPECT_EQ(w.At(4000 * kMs).counted_ns, 15 * kMs);
  w.Started(5000 * kMs, -7 * kMs);
  EXPECT_EQ(w.At(5010 * kMs).current_ns, 10 * kMs);
}

TEST(WriteWaitsTest, AWriteStartedAfterTheReadersClockHasNotWaited) {
  WriteWaits w;
  w.Started(100 * kMs, 0);
  const WriteWaits::Waits earlier = w.At(50 * kMs);  // the sweeper read its clock first
  EXPECT_EQ(earlier.current_ns, 0);
  EXPECT_EQ(earlier.counted_ns, 0);
}

}  // namespace
}  // namespace lazyattn::router
