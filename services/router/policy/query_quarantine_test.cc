#include "services/router/policy/query_quarantine.h"

#include <gtest/gtest.h>

namespace lazyattn::router {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1000);
const RequestFingerprint kPoison{.hi = 1, .lo = 2};
const RequestFingerprint kOther{.hi = 3, .lo = 4};

QuarantineOptions Options() { return {.ttl = absl::Seconds(300), .max_entries = 4}; }

TEST(CountsAsLostMidCallTest, OnlyAnAttemptThatReachedItsWorker) {
  const AttemptEnd lost{.unavailable = true, .worker_headers = true};
  EXPECT_TRUE(CountsAsLostMidCall(lost));
  // Never reached the worker (a half-dead connection that was READY at the start): no record.
  AttemptEnd e = lost;
  e.worker_headers = false;
  EXPECT_FALSE(CountsAsLostMidCall(e));
  // The worker ended the call itself (its trailer came).
  e = lost;
  e.worker_trailer = true;
  EXPECT_FALSE(CountsAsLostMidCall(e));
  // The router cancelled it.
  e = lost;
  e.cancelled_by_router = true;
  EXPECT_FALSE(CountsAsLostMidCall(e));
  // Any other ending (a refusal, a deadline).
  e = lost;
  e.unavailable = false;
  EXPECT_FALSE(CountsAsLostMidCall(e));
}

TEST(QueryQuarantineTest, TheSecondLossQuarantinesForTheTtl) {
  QueryQuarantine q(Options());
  EXPECT_FALSE(q.IsQuarantined(kPoison, kT0));
  EXPECT_FALSE(q.RecordLoss(kPoison, "w1", kT0));  // one lost worker: fail over as usual
  EXPECT_FALSE(q.IsQuarantined(kPoison, kT0 + absl::Seconds(1)));
  EXPECT_TRUE(q.RecordLoss(kPoison, "w2", kT0 + absl::Seconds(2)));
  absl::Time until;
  EXPECT_TRUE(q.IsQuarantined(kPoison, kT0 + absl::Seconds(3), &until));
  EXPECT_EQ(until, kT0 + absl::Seconds(302));
  EXPECT_TRUE(q.IsQuarantined(kPoison, kT0 + absl::Seconds(301)));
  EXPECT_FALSE(q.IsQuarantined(kPoison, kT0 + absl::Seconds(302)));
  // Other content is never refused.
  EXPECT_FALSE(q.IsQuarantined(kOther, kT0 + absl::Seconds(3)));
}

TEST(QueryQuarantineTest, LossesOlderThanTheTtlAreForgotten) {
  QueryQuarantine q(Options());
  EXPECT_FALSE(q.RecordLoss(kPoison, "w1", kT0));
  // Two ordinary crashes far apart must not add up to a quarantine.
  EXPECT_FALSE(q.RecordLoss(kPoison, "w2", kT0 + absl::Seconds(300)));
  EXPECT_FALSE(q.IsQuarantined(kPoison, kT0 + absl::Seconds(301)));
  EXPECT_TRUE(q.RecordLoss(kPoison, "w3", kT0 + absl::Seconds(350)));
}

// Identical requests in flight on one worker all end when it dies: one crash, however many of
// them it held, never quarantines. The same worker lost again after the window (restarted and
// crashed anew) counts.
TEST(QueryQuarantineTest, LossesOnOneWorkerInOneCrashCountOnce) {
  QueryQuarantine q(Options());
  EXPECT_FALSE(q.RecordLoss(kPoison, "w1", kT0));
  EXPECT_FALSE(q.RecordLoss(kPoison, "w1", kT0));
  EXPECT_FALSE(q.RecordLoss(kPoison, "w1", kT0 + absl::Milliseconds(50)));
  EXPECT_FALSE(
      q.RecordLoss(kPoison, "w1", kT0 + QueryQuarantine::kOneCrashWindow - absl::Milliseconds(1)));
  EXPECT_FALSE(q.IsQuarantined(kPoison, kT0 + absl::Seconds(1)));
  EXPECT_FALSE(q.AnyQuarantined(kT0 + absl::Seconds(1)));
  // Its restarted process crashed by the same content: a second crash.
  EXPECT_TRUE(q.RecordLoss(kPoison, "w1", kT0 + QueryQuarantine::kOneCrashWindow));
  EXPECT_TRUE(q.IsQuarantined(kPoison, kT0 + QueryQuarantine::kOneCrashWindow + absl::Seconds(1)));
}

TEST(QueryQuarantineTest, ALossWhileQuarantinedKeepsItQuarantined) {
  QueryQuarantine q(Options());
  q.RecordLoss(kPoison, "w1", kT0);
  ASSERT_TRUE(q.RecordLoss(kPoison, "w2", kT0));
  EXPECT_TRUE(q.RecordLoss(kPoison, "w3", kT0 + absl::Seconds(10)));
  EXPECT_TRUE(q.RecordLoss(kPoison, "w1", kT0 + absl::Seconds(10) + absl::Milliseconds(500)));
  EXPECT_TRUE(q.IsQuarantined(kPoison, kT0 + absl::Seconds(299)));
}

TEST(QueryQuarantineTest, BoundedLeastRecentlyTouchedGoesFirst) {
  QueryQuarantine q(Options());  // 4 entries
  q.RecordLoss(kPoison, "w1", kT0);
  for (uint64_t i = 10; i < 13; ++i) q.RecordLoss({.hi = i, .lo = i}, "w1", kT0);
  EXPECT_EQ(q.size(), 4);
  q.RecordLoss(kPoison, "w2", kT0);  // touched: now the most recent, and quarantined
  EXPECT_TRUE(q.IsQuarantined(kPoison, kT0));
  for (uint64_t i = 20; i < 23; ++i) q.RecordLoss({.hi = i, .lo = i}, "w1", kT0);
  EXPECT_EQ(q.size(), 4);
  EXPECT_TRUE(q.IsQuarantined(kPoison, kT0));  // 10..12 were evicted, not it
  // kPoison is now the least recent entry: the next new suspects evict it first.
  for (uint64_t i = 30; i < 34; ++i) q.RecordLoss({.hi = i, .lo = i}, "w1", kT0);
  EXPECT_EQ(q.size(), 4);
  EXPECT_FALSE(q.IsQuarantined(kPoison, kT0));
}

TEST(QueryQuarantineTest, AnyQuarantinedIsFalseOnceEveryQuarantineRanOut) {
  QueryQuarantine q(Options());
  EXPECT_FALSE(q.AnyQuarantined(kT0));
  q.RecordLoss(kPoison, "w1", kT0);
  // One loss is remembered but refuses nothing: requests need not be fingerprinted.
  EXPECT_EQ(q.size(), 1);
  EXPECT_FALSE(q.AnyQuarantined(kT0));
  ASSERT_TRUE(q.RecordLoss(kPoison, "w2", kT0 + absl::Seconds(10)));  // until kT0 + 310 s
  q.RecordLoss(kOther, "w1", kT0 + absl::Seconds(20));
  ASSERT_TRUE(q.RecordLoss(kOther, "w2", kT0 + absl::Seconds(20)));  // until kT0 + 320 s
  EXPECT_TRUE(q.AnyQuarantined(kT0 + absl::Seconds(309)));
  EXPECT_TRUE(q.AnyQuarantined(kT0 + absl::Seconds(319)));
  // Both ran out: the expired entries are still kept, but nothing is live.
  EXPECT_EQ(q.size(), 2);
  EXPECT_FALSE(q.AnyQuarantined(kT0 + absl::Seconds(320)));
  EXPECT_FALSE(q.IsQuarantined(kOther, kT0 + absl::Seconds(320)));
  // A new quarantine turns it back on.
  q.RecordLoss(kPoison, "w1", kT0 + absl::Seconds(400));
  ASSERT_TRUE(q.RecordLoss(kPoison, "w2", kT0 + absl::Seconds(401)));
  EXPECT_TRUE(q.AnyQuarantined(kT0 + absl::Seconds(402)));
  EXPECT_FALSE(q.AnyQuarantined(kT0 + absl::Seconds(701)));
}

TEST(QueryQuarantineTest, ZeroTtlTurnsItOff) {
  QueryQuarantine q({.ttl = absl::ZeroDuration(), .max_entries = 4});
  EXPECT_FALSE(q.RecordLoss(kPoison, "w1", kT0));
  EXPECT_FALSE(q.RecordLoss(kPoison, "w2", kT0));
  EXPECT_FALSE(q.IsQuarantined(kPoison, kT0));
  EXPECT_FALSE(q.AnyQuarantined(kT0));
  EXPECT_EQ(q.size(), 0);
}

}  // namespace
}  // namespace lazyattn::router
