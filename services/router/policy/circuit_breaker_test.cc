#include "services/router/policy/circuit_breaker.h"

#include <gtest/gtest.h>

namespace lazyattn::router {
namespace {

using State = CircuitBreakers::State;
using Permit = CircuitBreakers::Permit;
const absl::Time kT0 = absl::FromUnixSeconds(1000);

// Only consecutive failures open these (the failure rate is tested on its own below).
CircuitBreakerOptions Consecutive(int threshold) {
  return {
      .failure_threshold = threshold, .open_duration = absl::Seconds(5), .failure_rate_percent = 0};
}

TEST(CircuitBreakerTest, OpensAfterConsecutiveFailuresAndProbesBack) {
  CircuitBreakers b(Consecutive(3));
  const Permit p = b.TryAcquire("w", kT0);
  ASSERT_TRUE(p);
  EXPECT_FALSE(p.probe);
  b.RecordFailure("w", p, kT0);
  b.RecordFailure("w", p, kT0);
  EXPECT_TRUE(b.TryAcquire("w", kT0));
  b.RecordFailure("w", p, kT0);
  EXPECT_EQ(b.StateOf("w", kT0), State::kOpen);
  EXPECT_FALSE(b.Available("w", kT0 + absl::Seconds(4)));
  EXPECT_FALSE(b.TryAcquire("w", kT0 + absl::Seconds(4)));

  // Half-open: one probe only.
  const absl::Time t1 = kT0 + absl::Seconds(5);
  EXPECT_EQ(b.StateOf("w", t1), State::kHalfOpen);
  const Permit probe = b.TryAcquire("w", t1);
  ASSERT_TRUE(probe);
  EXPECT_TRUE(probe.probe);
  EXPECT_FALSE(b.TryAcquire("w", t1));
  EXPECT_FALSE(b.Available("w", t1));
  b.RecordSuccess("w", probe, t1);
  EXPECT_EQ(b.StateOf("w", t1), State::kClosed);
  EXPECT_TRUE(b.TryAcquire("w", t1));
  EXPECT_TRUE(b.TryAcquire("w", t1));
}

TEST(CircuitBreakerTest, SuccessResetsTheCount) {
  CircuitBreakers b(Consecutive(2));
  const Permit p = b.TryAcquire("w", kT0);
  b.RecordFailure("w", p, kT0);
  b.RecordSuccess("w", p, kT0);
  b.RecordFailure("w", p, kT0);
  EXPECT_EQ(b.StateOf("w", kT0), State::kClosed);
  b.RecordFailure("w", p, kT0);
  EXPECT_EQ(b.StateOf("w", kT0), State::kOpen);
  EXPECT_EQ(b.StateOf("other", kT0), State::kClosed);
}

TEST(CircuitBreakerTest, FailedProbeReopens) {
  CircuitBreakers b(Consecutive(1));
  b.RecordFailure("w", b.TryAcquire("w", kT0), kT0);
  const absl::Time t1 = kT0 + absl::Seconds(5);
  const Permit probe = b.TryAcquire("w", t1);
  ASSERT_TRUE(probe.probe);
  b.RecordFailure("w", probe, t1);
  EXPECT_EQ(b.StateOf("w", t1 + absl::Seconds(4)), State::kOpen);
  EXPECT_TRUE(b.TryAcquire("w", t1 + absl::Seconds(5)).probe);
}

TEST(CircuitBreakerTest, LostProbeStopsBlockingAfterAPeriod) {
  CircuitBreakers b(Consecutive(1));
  b.RecordFailure("w", b.TryAcquire("w", kT0), kT0);
  const absl::Time t1 = kT0 + absl::Seconds(5);
  ASSERT_TRUE(b.TryAcquire("w", t1));
  EXPECT_FALSE(b.TryAcquire("w", t1 + absl::Seconds(1)));
  const Permit second = b.TryAcquire("w", t1 + absl::Seconds(5));
  EXPECT_TRUE(second.probe);
  // A released probe frees the slot at once.
  const absl::Time t2 = t1 + absl::Seconds(5);
  b.Release("w", second);
  EXPECT_TRUE(b.TryAcquire("w", t2).probe);
}

// A request sent before the breaker opened that succeeds afterwards says nothing about the worker
// as it is now: it must not close the breaker (nor must its failure extend the open period, nor
// its release free the probe slot).
TEST(CircuitBreakerTest, OutcomesOfRequestsSentBeforeItOpenedAreOldNews) {
  CircuitBreakers b(Consecutive(2));
  const Permit before = b.TryAcquire("w", kT0);  // a long request, still running
  const Permit failing = b.TryAcquire("w", kT0);
  b.RecordFailure("w", failing, kT0);
  b.RecordFailure("w", failing, kT0);
  ASSERT_EQ(b.StateOf("w", kT0), State::kOpen);

  b.RecordSuccess("w", before, kT0 + absl::Seconds(1));
  EXPECT_EQ(b.StateOf("w", kT0 + absl::Seconds(1)), State::kOpen);
  // Its failure does not push the half-open time back.
  b.RecordFailure("w", before, kT0 + absl::Seconds(4));
  const absl::Time t1 = kT0 + absl::Seconds(5);
  EXPECT_EQ(b.StateOf("w", t1), State::kHalfOpen);

  const Permit probe = b.TryAcquire("w", t1);
  ASSERT_TRUE(probe.probe);
  b.Release("w", before);  // not the probe's: the slot stays taken
  EXPECT_FALSE(b.TryAcquire("w", t1));
  b.RecordSuccess("w", before, t1);  // nor does a late success from before close it
  EXPECT_EQ(b.StateOf("w", t1), State::kHalfOpen);
  b.RecordSuccess("w", probe, t1);
  EXPECT_EQ(b.StateOf("w", t1), State::kClosed);
}

// The probe of an earlier open period that reports after the breaker opened again is old news too.
TEST(CircuitBreakerTest, ALateProbeOfAnEarlierPeriodDoesNotCloseIt) {
  CircuitBreakers b(Consecutive(1));
  b.RecordFailure("w", b.TryAcquire("w", kT0), kT0);
  const absl::Time t1 = kT0 + absl::Seconds(5);
  const Permit old_probe = b.TryAcquire("w", t1);  // lost for a whole period
  const absl::Time t2 = t1 + absl::Seconds(5);
  const Permit new_probe = b.TryAcquire("w", t2);
  ASSERT_TRUE(new_probe.probe);
  b.RecordFailure("w", new_probe, t2);
  ASSERT_EQ(b.StateOf("w", t2), State::kOpen);
  b.RecordSuccess("w", old_probe, t2);
  EXPECT_EQ(b.StateOf("w", t2), State::kOpen)
      << "the old probe was sent before the breaker opened again";
}

// Once the breaker has closed again, late outcomes of requests sent before it opened count for
// nothing: late timeouts must not reopen a worker whose probe just succeeded.
TEST(CircuitBreakerTest, LateOutcomesFromBeforeTheLastOpeningDoNotCountOnceClosed) {
  CircuitBreakers b(Consecutive(2));
  const Permit old = b.TryAcquire("w", kT0);  // sent, then the worker wedged
  b.RecordFailure("w", old, kT0);
  b.RecordFailure("w", old, kT0);
  ASSERT_EQ(b.StateOf("w", kT0), State::kOpen);
  const absl::Time t1 = kT0 + absl::Seconds(5);
  const Permit probe = b.TryAcquire("w", t1);
  b.RecordSuccess("w", probe, t1);
  ASSERT_EQ(b.StateOf("w", t1), State::kClosed);
  for (int i = 0; i < 3; ++i) b.RecordFailure("w", old, t1);  // their timeouts, late
  EXPECT_EQ(b.StateOf("w", t1), State::kClosed);
  // A current failure still counts, and a late success from before does not hide it.
  b.RecordFailure("w", b.TryAcquire("w", t1), t1);
  b.RecordSuccess("w", old, t1);
  b.RecordFailure("w", b.TryAcquire("w", t1), t1);
  EXPECT_EQ(b.StateOf("w", t1), State::kOpen);
}

// A probe that stayed out a whole period is replaced; its late release must not free the slot
// while its replacement is out.
TEST(CircuitBreakerTest, AReplacedProbesLateReleaseKeepsTheSlotTaken) {
  CircuitBreakers b(Consecutive(1));
  b.RecordFailure("w", b.TryAcquire("w", kT0), kT0);
  const absl::Time t1 = kT0 + absl::Seconds(5);
  const Permit first = b.TryAcquire("w", t1);
  const absl::Time t2 = t1 + absl::Seconds(5);
  const Permit second = b.TryAcquire("w", t2);
  ASSERT_TRUE(second.probe);
  b.Release("w", first);
  EXPECT_FALSE(b.TryAcquire("w", t2)) << "a third probe beside the second";
  b.Release("w", second);
  EXPECT_TRUE(b.TryAcquire("w", t2).probe);
}

// Requests sent while every worker was out (Bypass) speak for the worker as it is now.
TEST(CircuitBreakerTest, ABypassingRequestSentWhileOpenClosesItOnSuccess) {
  CircuitBreakers b(Consecutive(1));
  const Permit before = b.Bypass("w");
  b.RecordFailure("w", b.TryAcquire("w", kT0), kT0);
  ASSERT_EQ(b.StateOf("w", kT0), State::kOpen);
  b.RecordSuccess("w", before, kT0);
  EXPECT_EQ(b.StateOf("w", kT0), State::kOpen) << "sent before it opened";
  const Permit during = b.Bypass("w");
  EXPECT_TRUE(during);
  EXPECT_FALSE(during.probe);
  b.RecordFailure("w", during, kT0 + absl::Seconds(4));
  EXPECT_EQ(b.StateOf("w", kT0 + absl::Seconds(5)), State::kHalfOpen)
      << "a bypassing failure does not extend the period";
  b.RecordSuccess("w", during, kT0 + absl::Seconds(5));
  EXPECT_EQ(b.StateOf("w", kT0 + absl::Seconds(5)), State::kClosed);
}

// A worker that fails every other request never fails twice in a row; its failure rate opens it.
TEST(CircuitBreakerTest, FailureRateOpensAFlappingWorker) {
  CircuitBreakers b({.failure_threshold = 3,
                     .open_duration = absl::Seconds(5),
                     .failure_rate_percent = 50,
                     .failure_rate_min_requests = 10,
                     .failure_rate_window = absl::Seconds(10)});
  absl::Time t = kT0;
  int outcomes = 0;
  while (b.StateOf("w", t) == State::kClosed && outcomes < 100) {
    const Permit p = b.TryAcquire("w", t);
    ASSERT_TRUE(p);
    if (outcomes % 2 == 0) {
      b.RecordSuccess("w", p, t);
    } else {
      b.RecordFailure("w", p, t);
    }
    ++outcomes;
    t += absl::Milliseconds(100);
  }
  EXPECT_EQ(outcomes, 10) << "opens at the 10th outcome: 5 of 10 failed";
  EXPECT_EQ(b.StateOf("w", t), State::kOpen);
}

TEST(CircuitBreakerTest, FailureRateNeedsItsMinimumAndForgetsOldOutcomes) {
  CircuitBreakers b({.failure_threshold = 3,
                     .open_duration = absl::Seconds(5),
                     .failure_rate_percent = 50,
                     .failure_rate_min_requests = 10,
                     .failure_rate_window = absl::Seconds(10)});
  // 4 failures among 8 outcomes: half failed, but under the minimum.
  absl::Time t = kT0;
  for (int i = 0; i < 8; ++i) {
    const Permit p = b.TryAcquire("w", t);
    if (i % 2 == 0) {
      b.RecordSuccess("w", p, t);
    } else {
      b.RecordFailure("w", p, t);
    }
  }
  EXPECT_EQ(b.StateOf("w", t), State::kClosed);
  // A window later those are forgotten: 9 more outcomes, 4 failed, still under the minimum of the
  // window they fall in (and under 50 %).
  t += absl::Seconds(11);
  for (int i = 0; i < 9; ++i) {
    const Permit p = b.TryAcquire("w", t);
    if (i % 2 == 1) {
      b.RecordFailure("w", p, t);
    } else {
      b.RecordSuccess("w", p, t);
    }
  }
  EXPECT_EQ(b.StateOf("w", t), State::kClosed);
  // Within the window, a 10th outcome that fails makes 5 of 10.
  b.RecordFailure("w", b.TryAcquire("w", t), t);
  EXPECT_EQ(b.StateOf("w", t), State::kOpen);
}

// A worker forgotten (it left the registry) and back again starts a fresh breaker; a permit from
// before it was forgotten must not match the new breaker's openings.
TEST(CircuitBreakerTest, PermitsFromAForgottenBreakerDoNotMatchItsSuccessor) {
  CircuitBreakers b(Consecutive(1));
  b.RecordFailure("w", b.TryAcquire("w", kT0), kT0);
  const absl::Time t1 = kT0 + absl::Seconds(5);
  const Permit old_probe = b.TryAcquire("w", t1);  // still out when the worker is forgotten
  ASSERT_TRUE(old_probe.probe);
  b.Retain({});
  b.RecordFailure("w", b.TryAcquire("w", t1), t1);  // back, and failing: open again
  ASSERT_EQ(b.StateOf("w", t1), State::kOpen);
  b.RecordSuccess("w", old_probe, t1);
  EXPECT_EQ(b.StateOf("w", t1), State::kOpen);
  const absl::Time t2 = t1 + absl::Seconds(5);
  ASSERT_TRUE(b.TryAcquire("w", t2).probe);
  b.Release("w", old_probe);
  EXPECT_FALSE(b.TryAcquire("w", t2)) << "the old probe's release freed the new probe's slot";
}

TEST(CircuitBreakerTest, RetainForgetsDepartedWorkers) {
  CircuitBreakers b(Consecutive(1));
  b.RecordFailure("gone", b.TryAcquire("gone", kT0), kT0);
  b.RecordFailure("stays", b.TryAcquire("stays", kT0), kT0);
  EXPECT_EQ(b.tracked_workers(), 2u);
  b.Retain({"stays"});
  EXPECT_EQ(b.tracked_workers(), 1u);
  EXPECT_EQ(b.StateOf("gone", kT0), State::kClosed);
  EXPECT_EQ(b.StateOf("stays", kT0), State::kOpen);
}

}  // namespace
}  // namespace lazyattn::router
