// DirectoryIndex sessions: sequence gaps and the snapshot that repairs them, heartbeats, a Hello's
// snapshot replacing a worker's entries, a new epoch dropping them, and an older session's calls
// ignored once a newer Hello owns the worker.
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
using testing::Key;
using testing::kLease;
using testing::Pair;
using testing::Status;
using testing::Stored;

TEST_F(IndexTest, SequenceGapIgnoresEventsUntilSnapshot) {
  const uint64_t s = Join("w1");
  EXPECT_EQ(index_.ApplyEvent("w1", s, 3, Stored(1, 10), now_).outcome, ApplyOutcome::kApplied);
  const ApplyResult gap = index_.ApplyEvent("w1", s, 5, Stored(2, 20), now_);
  EXPECT_EQ(gap.outcome, ApplyOutcome::kGap);
  EXPECT_EQ(gap.last_seq, 3u);
  // In sequence again, but a snapshot is awaited: ignored, and no second gap is reported.
  EXPECT_EQ(index_.ApplyEvent("w1", s, 6, Stored(3, 30), now_).outcome,
            ApplyOutcome::kAwaitingSnapshot);
  EXPECT_EQ(index_.ApplyEvent("w1", s, 9, Stored(4, 40), now_).outcome,
            ApplyOutcome::kAwaitingSnapshot);
  EXPECT_THAT(Tokens({Key(1), Key(2), Key(3), Key(4)}), ElementsAre(Pair("w1", 10)));

  const std::vector<DocEntry> snap = {{Key(2), 20, kLazyOffset}, {Key(3), 30, kLazyOffset}};
  EXPECT_EQ(index_.ApplySnapshot("w1", s, 10, snap, nullptr, now_).outcome, ApplyOutcome::kApplied);
  EXPECT_EQ(index_.ApplyEvent("w1", s, 11, Stored(4, 40), now_).outcome, ApplyOutcome::kApplied);
  const auto r = index_.Lookup({Key(1), Key(2), Key(3), Key(4)}, now_);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_THAT(r[0].resident, ElementsAre(false, true, true, true));
  EXPECT_EQ(r[0].resident_tokens, 90);
}

TEST_F(IndexTest, RepeatedOrOldSeqIsAGap) {
  const uint64_t s = Join("w1");
  EXPECT_EQ(index_.ApplyEvent("w1", s, 3, Stored(1, 10), now_).outcome, ApplyOutcome::kApplied);
  EXPECT_EQ(index_.ApplyEvent("w1", s, 3, Stored(2, 10), now_).outcome, ApplyOutcome::kGap);
}

TEST_F(IndexTest, HeartbeatGapIsReportedAndHeartbeatsRenewWhileAwaiting) {
  const uint64_t s = Join("w1");
  v1::WorkerLoad load;
  load.set_running_requests(3);
  EXPECT_EQ(index_.Heartbeat("w1", s, 3, load, now_).outcome, ApplyOutcome::kApplied);
  EXPECT_EQ(index_.Heartbeat("w1", s, 5, load, now_).outcome, ApplyOutcome::kGap);
  load.set_running_requests(4);
  now_ += kLease - absl::Milliseconds(1);
  EXPECT_EQ(index_.Heartbeat("w1", s, 6, load, now_).outcome, ApplyOutcome::kApplied);
  now_ += kLease - absl::Milliseconds(1);  // alive only thanks to the last heartbeat
  const auto r = index_.Lookup({}, now_);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].status.load().running_requests(), 4);
}

TEST_F(IndexTest, HelloAwaitsSnapshotAndSnapshotReplacesEntries) {
  const uint64_t s = index_.Hello(Status("w1"), 7, 1, now_).session;
  // Before the snapshot arrives, events are ignored (the snapshot will include them).
  EXPECT_EQ(index_.ApplyEvent("w1", s, 2, Stored(1, 10), now_).outcome,
            ApplyOutcome::kAwaitingSnapshot);
  EXPECT_THAT(Tokens({Key(1)}), ElementsAre(Pair("w1", 0)));

  const std::vector<DocEntry> first = {{Key(1), 10, kLazyOffset}, {Key(2), 20, kLazyOffset}};
  v1::WorkerLoad load;
  load.set_free_blocks(99);
  index_.ApplySnapshot("w1", s, 3, first, &load, now_);
  EXPECT_THAT(Tokens({Key(1), Key(2)}), ElementsAre(Pair("w1", 30)));

  // A second snapshot replaces everything: key 1 is gone, key 3 appears; a repeated entry keeps
  // the last token count.
  const std::vector<DocEntry> second = {
      {Key(2), 20, kLazyOffset}, {Key(3), 5, kLazyOffset}, {Key(3), 6, kLazyOffset}};
  index_.ApplySnapshot("w1", s, 4, second, nullptr, now_);
  const auto r = index_.Lookup({Key(1), Key(2), Key(3)}, now_);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_THAT(r[0].resident, ElementsAre(false, true, true));
  EXPECT_EQ(r[0].resident_tokens, 26);
  EXPECT_EQ(r[0].status.load().free_blocks(), 99);  // null load kept the last one
  EXPECT_EQ(index_.Stats().documents, 2);
  EXPECT_EQ(index_.Stats().entries, 2);
}

TEST_F(IndexTest, SnapshotOfOneWorkerLeavesOthersAlone) {
  const uint64_t a = Join("a");
  const uint64_t b = Join("b");
  index_.ApplyEvent("a", a, 3, Stored(1, 10), now_);
  index_.ApplyEvent("b", b, 3, Stored(1, 10), now_);
  index_.ApplySnapshot("a", a, 4, {}, nullptr, now_);
  EXPECT_THAT(Tokens({Key(1)}), ElementsAre(Pair("a", 0), Pair("b", 10)));
}

TEST_F(IndexTest, NewEpochDropsEntriesSameEpochKeepsThemUntilSnapshot) {
  uint64_t s = Join("w1", /*epoch=*/7);
  index_.ApplyEvent("w1", s, 3, Stored(1, 10), now_);

  // Reconnect, same process: entries stay (probably still right) until the snapshot arrives.
  HelloResult hello = index_.Hello(Status("w1"), 7, 1, now_);
  EXPECT_FALSE(hello.entries_dropped);
  EXPECT_THAT(Tokens({Key(1)}), ElementsAre(Pair("w1", 10)));

  // Restarted process: its cache is empty, so are its entries, at once.
  hello = index_.Hello(Status("w1"), 8, 1, now_);
  EXPECT_TRUE(hello.entries_dropped);
  EXPECT_THAT(Tokens({Key(1)}), ElementsAre(Pair("w1", 0)));
  EXPECT_EQ(index_.Stats().documents, 0);
  EXPECT_EQ(index_.Stats().workers, 1);
}

TEST_F(IndexTest, OlderSessionIsIgnoredAfterANewHello) {
  const uint64_t old_session = Join("w1");
  const uint64_t new_session = index_.Hello(Status("w1"), 7, 1, now_).session;
  EXPECT_NE(old_session, new_session);
  EXPECT_EQ(index_.ApplyEvent("w1", old_session, 3, Stored(1, 10), now_).outcome,
            ApplyOutcome::kNoSession);
  EXPECT_EQ(index_.Heartbeat("w1", old_session, 3, {}, now_).outcome, ApplyOutcome::kNoSession);
  EXPECT_EQ(index_.ApplySnapshot("w1", old_session, 3, {}, nullptr, now_).outcome,
            ApplyOutcome::kNoSession);
  // The old stream closing does not touch the new session.
  index_.Disconnect("w1", old_session);
  EXPECT_EQ(index_.ApplySnapshot("w1", new_session, 2, {}, nullptr, now_).outcome,
            ApplyOutcome::kApplied);
  EXPECT_EQ(index_.ApplyEvent("unknown", new_session, 3, Stored(1, 10), now_).outcome,
            ApplyOutcome::kNoSession);
}

}  // namespace
}  // namespace lazyattn::kvdir
