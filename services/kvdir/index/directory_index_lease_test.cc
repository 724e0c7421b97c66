// DirectoryIndex leases: expiry removes a worker with all its entries, a returning worker starts
// empty, and a sweep after a stall of the directory itself extends leases instead of expiring them.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "services/kvdir/index/directory_index.h"
#include "services/kvdir/index/directory_index_test_fixture.h"

namespace lazyattn::kvdir {
namespace {

using ::testing::ElementsAre;
using testing::IndexTest;
using ::testing::IsEmpty;
using testing::Key;
using testing::kLease;
using testing::Pair;
using testing::Stored;

TEST_F(IndexTest, LeaseExpiryRemovesWorkerAndAllItsEntries) {
  const uint64_t a = Join("a");
  const uint64_t b = Join("b");
  index_.ApplyEvent("a", a, 3, Stored(1, 10), now_);
  index_.ApplyEvent("a", a, 4, Stored(2, 20), now_);
  index_.ApplyEvent("b", b, 3, Stored(2, 20), now_);
  index_.Disconnect("a", a);  // the stream closed; the lease still runs

  now_ += kLease / 2;
  index_.Heartbeat("b", b, 4, {}, now_);
  EXPECT_THAT(index_.ExpireLeases(now_), IsEmpty());
  EXPECT_THAT(Tokens({Key(1), Key(2)}), ElementsAre(Pair("a", 30), Pair("b", 20)));

  now_ += kLease / 2;  // a's lease ends exactly now; b's runs another half lease
  // Lookup hides an expired worker even before the sweep.
  EXPECT_THAT(Tokens({Key(1), Key(2)}), ElementsAre(Pair("b", 20)));
  EXPECT_THAT(index_.ExpireLeases(now_), ElementsAre("a"));
  EXPECT_EQ(index_.Stats().workers, 1);
  EXPECT_EQ(index_.Stats().documents, 1);
  EXPECT_EQ(index_.Stats().entries, 1);
  // The expired worker's stream (had it stayed open) no longer owns anything.
  EXPECT_EQ(index_.ApplyEvent("a", a, 5, Stored(3, 1), now_).outcome, ApplyOutcome::kNoSession);

  now_ += kLease;
  EXPECT_THAT(index_.ExpireLeases(now_), ElementsAre("b"));
  EXPECT_THAT(index_.Lookup({Key(2)}, now_), IsEmpty());
  EXPECT_EQ(index_.Stats().documents, 0);
}

// A worker that leaves (its stream half-closed cleanly) is removed at once, not at its lease's
// end; only the session that owns it can make it leave.
TEST_F(IndexTest, LeaveRemovesTheWorkerAtOnceForItsOwnSessionOnly) {
  const uint64_t a = Join("a");
  const uint64_t b = Join("b");
  index_.ApplyEvent("a", a, 3, Stored(1, 10), now_);
  index_.ApplyEvent("b", b, 3, Stored(1, 20), now_);
  EXPECT_FALSE(index_.Leave("a", b));  // another worker's session
  EXPECT_FALSE(index_.Leave("a", a + b + 100));
  EXPECT_THAT(Tokens({Key(1)}), ElementsAre(Pair("a", 10), Pair("b", 20)));
  EXPECT_TRUE(index_.Leave("a", a));
  EXPECT_THAT(Tokens({Key(1)}), ElementsAre(Pair("b", 20)));
  EXPECT_EQ(index_.Stats().workers, 1);
  EXPECT_EQ(index_.Stats().entries, 1);
  EXPECT_FALSE(index_.Leave("a", a));  // gone: its stream owns nothing any more
  EXPECT_EQ(index_.ApplyEvent("a", a, 4, Stored(2, 1), now_).outcome, ApplyOutcome::kNoSession);
  // Never counted as an expiry.
  now_ += kLease / 2;
  EXPECT_THAT(index_.ExpireLeases(now_), IsEmpty());
}

TEST_F(IndexTest, ReturningWorkerAfterExpiryStartsEmpty) {
  const uint64_t s = Join("w1");
  index_.ApplyEvent("w1", s, 3, Stored(1, 10), now_);
  now_ += kLease;
  index_.ExpireLeases(now_);
  Join("w1");
  EXPECT_THAT(Tokens({Key(1)}), ElementsAre(Pair("w1", 0)));
}

// Sweeps every lease / 4 expire as ExpireLeases does; a sweep that comes more than lease / 2
// after the previous one (the directory was stopped: SIGSTOP, a paused host) expires nobody and
// gives every worker a fresh lease, so the live ones renew it and only the silent one goes.
TEST_F(IndexTest, SweepAfterAStallOfTheDirectoryExtendsLeasesInsteadOfExpiring) {
  const uint64_t live = Join("live");
  Join("dead");
  index_.ApplyEvent("live", live, 3, Stored(1, 10), now_);
  EXPECT_THAT(index_.Sweep(now_).expired, IsEmpty());  // the first sweep: never a stall
  now_ += kLease / 4;
  SweepResult regular = index_.Sweep(now_);
  EXPECT_THAT(regular.expired, IsEmpty());
  EXPECT_EQ(regular.stalled, absl::ZeroDuration());

  // Frozen for 25 s: both leases passed long ago, nothing was read meanwhile. Until the sweeper
  // runs, lookups still list both workers (an empty list would empty every router's view).
  const absl::Time frozen_at = now_;
  now_ += absl::Seconds(25);
  EXPECT_THAT(Tokens({Key(1)}), ElementsAre(Pair("dead", 0), Pair("live", 10)));
  const SweepResult after = index_.Sweep(now_);
  EXPECT_THAT(after.expired, IsEmpty());
  EXPECT_EQ(after.stalled, now_ - frozen_at);
  EXPECT_EQ(after.extended, 2);
  EXPECT_THAT(Tokens({Key(1)}), ElementsAre(Pair("dead", 0), Pair("live", 10)));

  // The live worker's next heartbeat renews its lease; the dead one stays silent.
  now_ += kLease / 4;
  EXPECT_EQ(index_.Heartbeat("live", live, 4, {}, now_).outcome, ApplyOutcome::kApplied);
  EXPECT_THAT(index_.Sweep(now_).expired, IsEmpty());
  for (int i = 0; i < 2; ++i) {  // regular sweeps, up to one lease after the stalled one
    now_ += kLease / 4;
    const SweepResult r = index_.Sweep(now_);
    EXPECT_EQ(r.stalled, absl::ZeroDuration());
    EXPECT_THAT(r.expired, IsEmpty());
  }
  now_ += kLease / 4;
  EXPECT_THAT(index_.Sweep(now_).expired, ElementsAre("dead"));
  EXPECT_THAT(Tokens({Key(1)}), ElementsAre(Pair("live", 10)));
}

// The stall bound is lease / 2 between sweeps: exactly that is a regular sweep (a lease that
// passed expires), a little more is a stall. Lookup hides passed leases while sweeps are on time.
TEST_F(IndexTest, SweepStallBoundIsHalfALease) {
  EXPECT_EQ(index_.stall_after(), kLease / 2);
  Join("a");
  index_.Sweep(now_);
  now_ += kLease / 2;
  index_.Sweep(now_);
  Join("b");  // b's lease ends at now + lease; a's ends half a lease from now
  now_ += kLease / 2;
  EXPECT_THAT(Tokens({}), ElementsAre(Pair("b", 0)));  // a's lease passed: hidden at once
  const SweepResult on_time = index_.Sweep(now_);
  EXPECT_EQ(on_time.stalled, absl::ZeroDuration());
  EXPECT_THAT(on_time.expired, ElementsAre("a"));
  now_ += kLease / 2 + absl::Milliseconds(1);  // b's lease passed during a (short) stall
  EXPECT_THAT(Tokens({}), ElementsAre(Pair("b", 0)));
  const SweepResult stalled = index_.Sweep(now_);
  EXPECT_EQ(stalled.stalled, kLease / 2 + absl::Milliseconds(1));
  EXPECT_THAT(stalled.expired, IsEmpty());
  EXPECT_THAT(Tokens({}), ElementsAre(Pair("b", 0)));
  // ExpireLeases alone keeps no sweep clock: it removes what passed, stall or not.
  EXPECT_THAT(index_.ExpireLeases(now_ + kLease), ElementsAre("b"));
}

// The sweeper's own work between two sweeps (a lock wait behind a large snapshot, giving memory
// back) is not a stall of the directory: with SweeperWaits the gap counts from when it began
// waiting. Here its work took half a lease and its wait a quarter: three quarters since the last
// Sweep, but a regular sweep, and a lease that passed expires.
TEST_F(IndexTest, TheSweepersOwnWorkIsNotAStall) {
  Join("a");
  index_.Sweep(now_);
  now_ += kLease / 2;  // the sweeper's work after that sweep
  index_.SweeperWaits(now_);
  Join("b");
  now_ += kLease / 4;
  const SweepResult worked = index_.Sweep(now_);
  EXPECT_EQ(worked.stalled, absl::ZeroDuration());
  now_ += kLease / 4;  // a's lease has passed (one lease after its hello)
  index_.SweeperWaits(now_);
  now_ += kLease / 4;
  const SweepResult regular = index_.Sweep(now_);
  EXPECT_EQ(regular.stalled, absl::ZeroDuration());
  EXPECT_THAT(regular.expired, ElementsAre("a"));
  // Stopped while waiting: a stall as before.
  index_.SweeperWaits(now_);
  now_ += kLease;
  EXPECT_EQ(index_.Sweep(now_).stalled, kLease);
}

// A message kvdir has not handled yet (a snapshot waiting for kvdir's own threads) holds the
// worker's lease however long it waits: only the directory is slow. Its handling starts a new
// lease; a worker taken over meanwhile loses the mark all the same.
TEST_F(IndexTest, AMessageWaitingInKvdirHoldsTheLease) {
  const uint64_t a = Join("a");
  ASSERT_EQ(index_.ApplyEvent("a", a, 3, Stored(1, 10), now_).outcome, ApplyOutcome::kApplied);
  index_.MessageQueued("a", a, now_);
  now_ += 3 * kLease;
  EXPECT_TRUE(index_.ExpireLeases(now_).empty());
  EXPECT_THAT(Tokens({Key(1)}), ElementsAre(Pair("a", 10)));
  index_.MessageTaken("a", a, now_);
  now_ += kLease / 2;
  EXPECT_TRUE(index_.ExpireLeases(now_).empty());  // the lease ran from MessageTaken
  now_ += kLease / 2;
  EXPECT_THAT(index_.ExpireLeases(now_), ElementsAre("a"));

  // Queued by one session, taken over by another (same process reconnecting), taken by the first:
  // the mark goes, and the lease is the new session's own.
  const uint64_t b1 = Join("b");
  index_.MessageQueued("b", b1, now_);
  const uint64_t b2 = index_.Hello(testing::Status("b"), 7, 1, now_).session;
  ASSERT_NE(b1, b2);
  index_.MessageTaken("b", b1, now_ + kLease / 2);
  now_ += kLease;
  EXPECT_THAT(index_.ExpireLeases(now_), ElementsAre("b"));
  EXPECT_EQ(index_.Stats().workers, 0);

  // The other order: the new session queues its snapshot, then the old stream's message, read
  // after the takeover, asks for a mark. It gets none (false), so kvdir takes none for it: taking
  // one would drop the new session's mark, and its worker would expire while its snapshot waits.
  const uint64_t c1 = Join("c");
  const uint64_t c2 = index_.Hello(testing::Status("c"), 7, 1, now_).session;
  ASSERT_NE(c1, c2);
  EXPECT_TRUE(index_.MessageQueued("c", c2, now_));
  EXPECT_FALSE(index_.MessageQueued("c", c1, now_));
  now_ += 3 * kLease;
  EXPECT_TRUE(index_.ExpireLeases(now_).empty()) << "the waiting snapshot holds the lease";
  index_.MessageTaken("c", c2, now_);
  now_ += kLease;
  EXPECT_THAT(index_.ExpireLeases(now_), ElementsAre("c"));
}

}  // namespace
}  // namespace lazyattn::kvdir
