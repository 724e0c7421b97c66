#include "services/router/policy/circuit_breaker.h"

#include <gtest/gtest.h>

namespace lazyattn::router {
namespace {

using State = CircuitBreakers::State;
const absl::Time kT0 = absl::FromUnixSeconds(1000);

TEST(CircuitBreakerTest, OpensAfterConsecutiveFailuresAndProbesBack) {
  CircuitBreakers b({.failure_threshold = 3, .open_duration = absl::Seconds(5)});
  b.RecordFailure("w", kT0);
  b.RecordFailure("w", kT0);
  EXPECT_TRUE(b.TryAcquire("w", kT0));
  b.RecordFailure("w", kT0);
  EXPECT_EQ(b.StateOf("w", kT0), State::kOpen);
  EXPECT_FALSE(b.Available("w", kT0 + absl::Seconds(4)));
  EXPECT_FALSE(b.TryAcquire("w", kT0 + absl::Seconds(4)));

  // Half-open: one probe only.
  const absl::Time t1 = kT0 + absl::Seconds(5);
  EXPECT_EQ(b.StateOf("w", t1), State::kHalfOpen);
  EXPECT_TRUE(b.TryAcquire("w", t1));
  EXPECT_FALSE(b.TryAcquire("w", t1));
  EXPECT_FALSE(b.Available("w", t1));
  b.RecordSuccess("w");
  EXPECT_EQ(b.StateOf("w", t1), State::kClosed);
  EXPECT_TRUE(b.TryAcquire("w", t1));
  EXPECT_TRUE(b.TryAcquire("w", t1));
}

TEST(CircuitBreakerTest, SuccessResetsTheCount) {
  CircuitBreakers b({.failure_threshold = 2, .open_duration = absl::Seconds(5)});
  b.RecordFailure("w", kT0);
  b.RecordSuccess("w");
  b.RecordFailure("w", kT0);
  EXPECT_EQ(b.StateOf("w", kT0), State::kClosed);
  b.RecordFailure("w", kT0);
  EXPECT_EQ(b.StateOf("w", kT0), State::kOpen);
  EXPECT_EQ(b.StateOf("other", kT0), State::kClosed);
}

TEST(CircuitBreakerTest, FailedProbeReopens) {
  CircuitBreakers b({.failure_threshold = 1, .open_duration = absl::Seconds(5)});
  b.RecordFailure("w", kT0);
  const absl::Time t1 = kT0 + absl::Seconds(5);
  ASSERT_TRUE(b.TryAcquire("w", t1));
  b.RecordFailure("w", t1);
  EXPECT_EQ(b.StateOf("w", t1 + absl::Seconds(4)), State::kOpen);
  EXPECT_TRUE(b.TryAcquire("w", t1 + absl::Seconds(5)));
}

TEST(CircuitBreakerTest, LostProbeStopsBlockingAfterAPeriod) {
  CircuitBreakers b({.failure_threshold = 1, .open_duration = absl::Seconds(5)});
  b.RecordFailure("w", kT0);
  const absl::Time t1 = kT0 + absl::Seconds(5);
  ASSERT_TRUE(b.TryAcquire("w", t1));
  EXPECT_FALSE(b.TryAcquire("w", t1 + absl::Seconds(1)));
  EXPECT_TRUE(b.TryAcquire("w", t1 + absl::Seconds(5)));
  // A released probe frees the slot at once.
  const absl::Time t2 = t1 + absl::Seconds(5);
  b.Release("w");
  EXPECT_TRUE(b.TryAcquire("w", t2));
}

}  // namespace
}  // namespace lazyattn::router
