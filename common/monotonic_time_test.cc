#include "common/monotonic_time.h"

#include "gtest/gtest.h"

namespace lazyattn {
namespace {

TEST(MonotonicTimeTest, NeverGoesBackAndConvertsToTheWallClocksReading) {
  absl::Time last = MonotonicNow();
  for (int i = 0; i < 1000; ++i) {
    const absl::Time t = MonotonicNow();
    ASSERT_GE(t, last);
    last = t;
  }
  const absl::Time wall_before = absl::Now();
  const absl::Time monotonic = MonotonicNow();
  const absl::Time wall_after = absl::Now();
  const absl::Time converted = WallTimeOf(monotonic);
  // Two clock reads apart at most; generous for a loaded machine.
  EXPECT_GE(converted, wall_before - absl::Milliseconds(50));
  EXPECT_LE(converted, wall_after + absl::Milliseconds(50));
  // A moment ago stays a moment ago.
  EXPECT_NEAR(absl::ToDoubleSeconds(absl::Now() - WallTimeOf(monotonic - absl::Seconds(30))), 30,
              0.05);
}

TEST(MonotonicTimeTest, ConvertsToTheSteadyClocksTimePointForWaits) {
  const auto before = std::chrono::steady_clock::now();
  const absl::Time now = MonotonicNow();
  const auto after = std::chrono::steady_clock::now();
  EXPECT_GE(ToSteadyTimePoint(now), before);
  EXPECT_LE(ToSteadyTimePoint(now), after);
  EXPECT_EQ(ToSteadyTimePoint(now + absl::Milliseconds(250)) - ToSteadyTimePoint(now),
            std::chrono::milliseconds(250));
}

}  // namespace
}  // namespace lazyattn
