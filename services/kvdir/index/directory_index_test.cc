#include "services/kvdir/index/directory_index.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace lazyattn::kvdir {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

constexpr absl::Duration kLease = absl::Seconds(3);

DocumentKey Key(uint64_t n) { return DocumentKey{n, ~n}; }

v1::WorkerStatus Status(const std::string& id) {
  v1::WorkerStatus s;
  s.set_worker_id(id);
  s.set_address(id + ".local:7000");
  return s;
}

DocEvent Stored(uint64_t key, int64_t tokens, int64_t offset = kLazyOffset) {
  return DocEvent{DocEventKind::kStored, DocEntry{Key(key), tokens, offset}};
}
DocEvent Evicted(uint64_t key, int64_t offset = kLazyOffset) {
  return DocEvent{DocEventKind::kEvicted, DocEntry{Key(key), 0, offset}};
}

// A worker that said Hello (seq 1) and sent an empty snapshot (seq 2): ready for events at seq 3.
class IndexTest : public ::testing::Test {
 protected:
  // `peer_host`: the host the worker's stream comes from.
  uint64_t Join(const std::string& id, uint64_t epoch = 7, const std::string& peer_host = "") {
    const uint64_t session =
        index_.Hello(Status(id), epoch, 1, now_, {.peer_host = peer_host}).session;
    EXPECT_EQ(index_.ApplySnapshot(id, session, 2, {}, nullptr, now_).outcome,
              ApplyOutcome::kApplied);
    return session;
  }
  // id -> resident_tokens for `keys`.
  std::vector<std::pair<std::string, int64_t>> Tokens(const std::vector<DocumentKey>& keys) {
    std::vector<std::pair<std::string, int64_t>> out;
    for (const WorkerResidency& r : index_.Lookup(keys, now_)) {
      out.emplace_back(r.status.worker_id(), r.resident_tokens);
    }
    return out;
  }

  absl::Time now_ = absl::FromUnixSeconds(1'700'000'000);
  DirectoryIndex index_{kLease};
};

using Pair = std::pair<std::string, int64_t>;

TEST_F(IndexTest, StoredEventsAreVisibleAndEvictionRemovesThem) {
  const uint64_t s = Join("w1");
  EXPECT_EQ(index_.ApplyEvent("w1", s, 3, Stored(1, 100), now_).outcome, ApplyOutcome::kApplied);
  EXPECT_EQ(index_.ApplyEvent("w1", s, 4, Stored(2, 50), now_).outcome, ApplyOutcome::kApplied);
  EXPECT_THAT(Tokens({Key(1), Key(2), Key(3)}), ElementsAre(Pair("w1", 150)));
  EXPECT_EQ(index_.Stats().documents, 2);

  EXPECT_EQ(index_.ApplyEvent("w1", s, 5, Evicted(1), now_).outcome, ApplyOutcome::kApplied);
  const auto r = index_.Lookup({Key(1), Key(2)}, now_);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_THAT(r[0].resident, ElementsAre(false, true));
  EXPECT_EQ(r[0].resident_tokens, 50);
  EXPECT_EQ(index_.Stats().documents, 1);
  EXPECT_EQ(index_.Stats().entries, 1);
}

TEST_F(IndexTest, LookupSumsTokensPerWorkerAndListsWorkersHoldingNothing) {
  const uint64_t a = Join("a");
  const uint64_t b = Join("b");
  Join("c");
  index_.ApplyEvent("a", a, 3, Stored(1, 100), now_);
  index_.ApplyEvent("a", a, 4, Stored(2, 30), now_);
  index_.ApplyEvent("b", b, 3, Stored(2, 30), now_);
  index_.ApplyEvent("b", b, 4, Stored(3, 7), now_);

  const std::vector<DocumentKey> keys = {Key(2), Key(1), Key(9), Key(3)};
  const auto r = index_.Lookup(keys, now_);
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0].status.worker_id(), "a");
  EXPECT_EQ(r[0].resident_tokens, 130);
  EXPECT_THAT(r[0].resident, ElementsAre(true, true, false, false));
  EXPECT_EQ(r[1].status.worker_id(), "b");
  EXPECT_EQ(r[1].resident_tokens, 37);
  EXPECT_THAT(r[1].resident, ElementsAre(true, false, false, true));
  EXPECT_EQ(r[2].status.worker_id(), "c");
  EXPECT_EQ(r[2].resident_tokens, 0);
  EXPECT_THAT(r[2].resident, ElementsAre(false, false, false, false));
  EXPECT_EQ(r[2].status.address(), "c.local:7000");
}

TEST_F(IndexTest, EntriesPerOffsetCountOnceAndEvictPerOffset) {
  const uint64_t s = Join("w1");
  index_.ApplyEvent("w1", s, 3, Stored(1, 64, /*offset=*/0), now_);
  index_.ApplyEvent("w1", s, 4, Stored(1, 64, /*offset=*/128), now_);
  EXPECT_THAT(Tokens({Key(1)}), ElementsAre(Pair("w1", 64)));
  EXPECT_EQ(index_.Stats().entries, 2);
  index_.ApplyEvent("w1", s, 5, Evicted(1, /*offset=*/0), now_);
  EXPECT_THAT(Tokens({Key(1)}), ElementsAre(Pair("w1", 64)));
  index_.ApplyEvent("w1", s, 6, Evicted(1, /*offset=*/kLazyOffset), now_);  // not held: no-op
  EXPECT_THAT(Tokens({Key(1)}), ElementsAre(Pair("w1", 64)));
  index_.ApplyEvent("w1", s, 7, Evicted(1, /*offset=*/128), now_);
  EXPECT_THAT(Tokens({Key(1)}), ElementsAre(Pair("w1", 0)));
  EXPECT_EQ(index_.Stats().documents, 0);
}

TEST_F(IndexTest, RepeatedKeyInLookupCountsEachOccurrence) {
  const uint64_t s = Join("w1");
  index_.ApplyEvent("w1", s, 3, Stored(1, 10), now_);
  EXPECT_THAT(Tokens({Key(1), Key(1)}), ElementsAre(Pair("w1", 20)));
}

// The residency rule per mode: w1 holds key 1 position-free (lazy) and key 2 in block mode at
// offset 37 only; w2 holds key 1 in block mode at offsets 0 and 37 (different token counts, as a
// truncated copy would have) and key 2 position-free.
class ResidencyRuleTest : public IndexTest {
 protected:
  void SetUp() override {
    const uint64_t s1 = Join("w1");
    index_.ApplyEvent("w1", s1, 3, Stored(1, 100), now_);
    index_.ApplyEvent("w1", s1, 4, Stored(2, 50, 37), now_);
    const uint64_t s2 = Join("w2");
    index_.ApplyEvent("w2", s2, 3, Stored(1, 90, 0), now_);
    index_.ApplyEvent("w2", s2, 4, Stored(1, 100, 37), now_);
    index_.ApplyEvent("w2", s2, 5, Stored(2, 50), now_);
  }
  // "id: tokens [resident...]" per worker.
  std::vector<std::string> Residency(ResidencyRule rule, std::vector<int64_t> offsets) {
    std::vector<std::string> out;
    for (const WorkerResidency& r : index_.Lookup({Key(1), Key(2)}, rule, offsets, now_)) {
      std::string line = r.status.worker_id() + ": " + std::to_string(r.resident_tokens);
      for (bool b : r.resident) line += b ? " 1" : " 0";
      out.push_back(line);
    }
    return out;
  }
};

TEST_F(ResidencyRuleTest, LazyCountsOnlyPositionFreeEntries) {
  // w2's block entries of key 1 (offsets 0 and 37) are no hit for a lazy request: it re-encodes.
  EXPECT_THAT(Residency(ResidencyRule::kLazy, {}), ElementsAre("w1: 100 1 0", "w2: 50 0 1"));
  // Offsets are ignored in mode lazy.
  EXPECT_THAT(Residency(ResidencyRule::kLazy, {37, 37}),
              ElementsAre("w1: 100 1 0", "w2: 50 0 1"));
}

TEST_F(ResidencyRuleTest, BlockCountsOnlyTheEntryAtTheRequestsOffset) {
  // Key 1 at 0, key 2 at 37: w2 has key 1 at 0 (90 tokens); w1 has key 2 at 37.
  EXPECT_THAT(Residency(ResidencyRule::kBlock, {0, 37}), ElementsAre("w1: 50 0 1", "w2: 90 1 0"));
  // Key 1 at 37 takes that entry's token count; key 2 at 0 is nowhere (w2's copy is lazy).
  EXPECT_THAT(Residency(ResidencyRule::kBlock, {37, 0}), ElementsAre("w1: 0 0 0", "w2: 100 1 0"));
  // Another offset, or an unknown one, or none given: no hit anywhere.
  EXPECT_THAT(Residency(ResidencyRule::kBlock, {5, 36}), ElementsAre("w1: 0 0 0", "w2: 0 0 0"));
  EXPECT_THAT(Residency(ResidencyRule::kBlock, {kUnknownOffset, kUnknownOffset}),
              ElementsAre("w1: 0 0 0", "w2: 0 0 0"));
  EXPECT_THAT(Residency(ResidencyRule::kBlock, {}), ElementsAre("w1: 0 0 0", "w2: 0 0 0"));
  EXPECT_THAT(Residency(ResidencyRule::kBlock, {0}), ElementsAre("w1: 0 0 0", "w2: 90 1 0"));
}

TEST_F(ResidencyRuleTest, BlockReportsWhatIsHeldOnlyElsewhereAsCopyable) {
  auto copyable = [&](std::vector<int64_t> offsets) {
    std::vector<int64_t> out;
    for (const WorkerResidency& r : index_.Lookup({Key(1), Key(2)}, ResidencyRule::kBlock,
                                                  offsets, now_)) {
      out.push_back(r.copyable_tokens);
    }
    return out;
  };
  // Key 1 at 0: w1 holds it position-free (copied, 100), w2 at 0 (a hit). Key 2 at 37: w1's is
  // there (a hit), w2's is position-free (copied, 50).
  EXPECT_THAT(copyable({0, 37}), ElementsAre(100, 50));
  // Nowhere at 5 or unplaced: everything held is copyable, w2's key 1 with its larger count.
  EXPECT_THAT(copyable({5, kUnknownOffset}), ElementsAre(150, 150));
  // Other rules report no copies.
  for (const WorkerResidency& r : index_.Lookup({Key(1), Key(2)}, ResidencyRule::kLazy, {}, now_)) {
    EXPECT_EQ(r.copyable_tokens, 0);
  }
}

TEST_F(ResidencyRuleTest, PrefixCountsNothingAndAnyEntryKeepsTheOldAnswer) {
  EXPECT_THAT(Residency(ResidencyRule::kNone, {0, 37}), ElementsAre("w1: 0 0 0", "w2: 0 0 0"));
  // A router that sends no mode: any entry, a key at several offsets with its largest count.
  EXPECT_THAT(Residency(ResidencyRule::kAnyEntry, {}),
              ElementsAre("w1: 150 1 1", "w2: 150 1 1"));
}

TEST_F(ResidencyRuleTest, EvictingOneOffsetLeavesTheOthers) {
  index_.ApplyEvent("w2", index_.Hello(Status("w2"), 7, 10, now_).session, 11, Evicted(1, 0),
                    now_);  // awaiting a snapshot after Hello: ignored
  EXPECT_THAT(Residency(ResidencyRule::kBlock, {0, 37}), ElementsAre("w1: 50 0 1", "w2: 90 1 0"));
  const uint64_t s = index_.Hello(Status("w2"), 7, 20, now_).session;
  const std::vector<DocEntry> snap = {{Key(1), 100, 37}, {Key(2), 50, kLazyOffset}};
  ASSERT_EQ(index_.ApplySnapshot("w2", s, 21, snap, nullptr, now_).outcome,
            ApplyOutcome::kApplied);
  EXPECT_EQ(index_.ApplyEvent("w2", s, 22, Evicted(1, 37), now_).outcome, ApplyOutcome::kApplied);
  EXPECT_THAT(Residency(ResidencyRule::kBlock, {37, 37}), ElementsAre("w1: 50 0 1", "w2: 0 0 0"));
  EXPECT_THAT(Residency(ResidencyRule::kLazy, {}), ElementsAre("w1: 100 1 0", "w2: 50 0 1"));
}

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

v1::WorkerStatus StatusAt(const std::string& id, const std::string& address) {
  v1::WorkerStatus s = Status(id);
  s.set_address(address);
  return s;
}

// A second live process started with the id of a live, connected worker (a copied
// --worker-id): refused, so the two cannot take turns dropping each other's entries.
TEST_F(IndexTest, HelloForAnIdHeldByALiveConnectedWorkerElsewhereIsRefused) {
  const uint64_t holder = Join("w1");
  ASSERT_EQ(index_.ApplyEvent("w1", holder, 3, Stored(1, 10), now_).outcome,
            ApplyOutcome::kApplied);

  now_ += kLease / 2;  // well inside the lease
  const HelloResult dup = index_.Hello(StatusAt("w1", "other.local:7000"), 99, 1, now_);
  EXPECT_TRUE(dup.id_in_use);
  EXPECT_EQ(dup.holder_address, "w1.local:7000");
  EXPECT_EQ(dup.session, 0u);
  EXPECT_FALSE(dup.entries_dropped);  // a new epoch, yet nothing was dropped
  EXPECT_FALSE(dup.refused);

  // The holder is untouched: same address and entries, and its session still owns the worker
  // (its next message is in sequence and applied).
  const auto r = index_.Lookup({Key(1)}, now_);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].status.address(), "w1.local:7000");
  EXPECT_EQ(r[0].resident_tokens, 10);
  EXPECT_EQ(index_.ApplyEvent("w1", holder, 4, Stored(2, 20), now_).outcome,
            ApplyOutcome::kApplied);
  EXPECT_EQ(index_.Heartbeat("w1", holder, 5, {}, now_).outcome, ApplyOutcome::kApplied);
  EXPECT_THAT(Tokens({Key(1), Key(2)}), ElementsAre(Pair("w1", 30)));
  EXPECT_EQ(index_.Stats().workers, 1);

  // The refusal did not renew anything: the holder's lease runs from its own last message.
  now_ += kLease;
  EXPECT_THAT(index_.ExpireLeases(now_), ElementsAre("w1"));
}

TEST_F(IndexTest, HelloFromTheHoldersAddressReplacesIt) {
  // A restart on the same port (new epoch) before the old stream is noticed closed.
  const uint64_t old_session = Join("w1", /*epoch=*/7);
  index_.ApplyEvent("w1", old_session, 3, Stored(1, 10), now_);
  const HelloResult restart = index_.Hello(Status("w1"), 8, 1, now_);
  EXPECT_FALSE(restart.id_in_use);
  EXPECT_NE(restart.session, 0u);
  EXPECT_TRUE(restart.entries_dropped);
  EXPECT_EQ(index_.Heartbeat("w1", old_session, 4, {}, now_).outcome, ApplyOutcome::kNoSession);
  // A reconnect of the same process (same epoch) over a stream not yet seen closed.
  const HelloResult reconnect = index_.Hello(Status("w1"), 8, 1, now_);
  EXPECT_FALSE(reconnect.id_in_use);
  EXPECT_NE(reconnect.session, restart.session);
}

TEST_F(IndexTest, HelloReplacesADisconnectedHolderAtOnceFromAnyAddress) {
  // A crashed worker's stream closes; a replacement elsewhere (a pod with a new IP) takes over.
  const uint64_t old_session = Join("w1");
  index_.ApplyEvent("w1", old_session, 3, Stored(1, 10), now_);
  index_.Disconnect("w1", old_session);
  const HelloResult moved = index_.Hello(StatusAt("w1", "10.0.0.9:7000"), 8, 1, now_);
  EXPECT_FALSE(moved.id_in_use);
  EXPECT_NE(moved.session, 0u);
  EXPECT_TRUE(moved.entries_dropped);
  const auto r = index_.Lookup({}, now_);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].status.address(), "10.0.0.9:7000");
}

TEST_F(IndexTest, HelloReplacesAConnectedHolderWhoseLeasePassed) {
  // A frozen process: its stream is open but it sends nothing.
  const uint64_t frozen = Join("w1");
  now_ += kLease - absl::Milliseconds(1);
  EXPECT_TRUE(index_.Hello(StatusAt("w1", "10.0.0.9:7000"), 8, 1, now_).id_in_use);
  now_ += absl::Milliseconds(1);  // the lease ends exactly now (not yet swept)
  const HelloResult moved = index_.Hello(StatusAt("w1", "10.0.0.9:7000"), 8, 1, now_);
  EXPECT_FALSE(moved.id_in_use);
  EXPECT_NE(moved.session, 0u);
  EXPECT_EQ(index_.Heartbeat("w1", frozen, 3, {}, now_).outcome, ApplyOutcome::kNoSession);
}

TEST_F(IndexTest, ASecondHelloOnTheHoldingStreamMayChangeTheAddress) {
  const uint64_t s = Join("w1");
  const HelloResult again =
      index_.Hello(StatusAt("w1", "renamed.local:7000"), 7, 3, now_, {.session = s});
  EXPECT_FALSE(again.id_in_use);
  EXPECT_NE(again.session, 0u);
  // Any other session (an older stream) of another process (epoch) is refused.
  EXPECT_TRUE(index_.Hello(Status("w1"), 8, 1, now_, {.session = s}).id_in_use);
}

TEST_F(IndexTest, AStallOfTheDirectoryDoesNotLetADuplicateTakeOver) {
  // While the sweeper is overdue every registered worker counts as live (as in Lookup): its
  // heartbeats wait unread, so a passed lease says nothing about the holder.
  Join("w1");
  index_.Sweep(now_);
  now_ += kLease * 5;
  EXPECT_TRUE(index_.Hello(StatusAt("w1", "10.0.0.9:7000"), 8, 1, now_).id_in_use);
}

// Two copies advertising one address (a compose service scaled to two: both say worker-0:7000)
// from two hosts: the peer host tells them apart, and the second is refused as a copy with another
// address would be.
TEST_F(IndexTest, HelloWithTheHoldersAddressFromAnotherPeerHostIsRefused) {
  const uint64_t holder = Join("w1", /*epoch=*/7, "10.0.0.5");
  ASSERT_EQ(index_.ApplyEvent("w1", holder, 3, Stored(1, 10), now_).outcome,
            ApplyOutcome::kApplied);
  now_ += kLease / 2;
  const HelloResult dup = index_.Hello(Status("w1"), 99, 1, now_, {.peer_host = "10.0.0.6"});
  EXPECT_TRUE(dup.id_in_use);
  EXPECT_EQ(dup.holder_address, "w1.local:7000");
  EXPECT_EQ(dup.holder_peer_host, "10.0.0.5");
  EXPECT_EQ(dup.session, 0u);
  EXPECT_FALSE(dup.entries_dropped);

  // The holder keeps its session and entries, and its host: a second try from the other host is
  // refused again, one from the holder's own host is the holder reconnecting.
  EXPECT_EQ(index_.ApplyEvent("w1", holder, 4, Stored(2, 20), now_).outcome,
            ApplyOutcome::kApplied);
  EXPECT_THAT(Tokens({Key(1), Key(2)}), ElementsAre(Pair("w1", 30)));
  EXPECT_TRUE(index_.Hello(Status("w1"), 99, 1, now_, {.peer_host = "10.0.0.6"}).id_in_use);
  const HelloResult reconnect = index_.Hello(Status("w1"), 7, 1, now_, {.peer_host = "10.0.0.5"});
  EXPECT_FALSE(reconnect.id_in_use);
  EXPECT_NE(reconnect.session, 0u);
  EXPECT_FALSE(reconnect.entries_dropped);  // same epoch: a reconnect keeps the entries
}

// The holder's own process (its epoch) reconnecting from a new address and host, before its
// old stream is seen closed (a dual-stack name, a changed IP): it takes its id back at once and
// keeps its entries, where another process would be refused until the lease passed.
TEST_F(IndexTest, TheHoldersOwnProcessReconnectsFromAnywhere) {
  const uint64_t old_session = Join("w1", /*epoch=*/7, "10.0.0.5");
  ASSERT_EQ(index_.ApplyEvent("w1", old_session, 3, Stored(1, 10), now_).outcome,
            ApplyOutcome::kApplied);
  EXPECT_TRUE(
      index_.Hello(StatusAt("w1", "w1.v6:7000"), 8, 1, now_, {.peer_host = "[fd00::5]"}).id_in_use);
  const HelloResult back =
      index_.Hello(StatusAt("w1", "w1.v6:7000"), 7, 1, now_, {.peer_host = "[fd00::5]"});
  EXPECT_FALSE(back.id_in_use);
  EXPECT_NE(back.session, 0u);
  EXPECT_FALSE(back.entries_dropped);
  EXPECT_EQ(index_.Heartbeat("w1", old_session, 4, {}, now_).outcome, ApplyOutcome::kNoSession);
  EXPECT_THAT(Tokens({Key(1)}), ElementsAre(Pair("w1", 10)));
}

TEST_F(IndexTest, AnotherAddressFromTheHoldersPeerHostIsStillRefused) {
  // Two workers on one host (or behind one NAT) share a peer host: the address tells them apart.
  Join("w1", /*epoch=*/7, "10.0.0.5");
  const HelloResult dup =
      index_.Hello(StatusAt("w1", "w1.local:7001"), 8, 1, now_, {.peer_host = "10.0.0.5"});
  EXPECT_TRUE(dup.id_in_use);
  EXPECT_EQ(dup.holder_address, "w1.local:7000");
  EXPECT_EQ(dup.holder_peer_host, "10.0.0.5");
}

TEST_F(IndexTest, HelloWithTheHoldersAddressFromItsPeerHostReplacesIt) {
  // A restart on the same host and port (new epoch) before the old stream is noticed closed.
  const uint64_t old_session = Join("w1", /*epoch=*/7, "[::1]");
  index_.ApplyEvent("w1", old_session, 3, Stored(1, 10), now_);
  const HelloResult restart = index_.Hello(Status("w1"), 8, 1, now_, {.peer_host = "[::1]"});
  EXPECT_FALSE(restart.id_in_use);
  EXPECT_NE(restart.session, 0u);
  EXPECT_TRUE(restart.entries_dropped);
  EXPECT_EQ(index_.Heartbeat("w1", old_session, 4, {}, now_).outcome, ApplyOutcome::kNoSession);
}

TEST_F(IndexTest, ADisconnectedHolderIsReplacedFromAnyPeerHost) {
  // A crashed worker's replacement on another machine, advertising the same name.
  const uint64_t old_session = Join("w1", /*epoch=*/7, "10.0.0.5");
  index_.ApplyEvent("w1", old_session, 3, Stored(1, 10), now_);
  index_.Disconnect("w1", old_session);
  const HelloResult moved = index_.Hello(Status("w1"), 8, 1, now_, {.peer_host = "10.0.0.6"});
  EXPECT_FALSE(moved.id_in_use);
  EXPECT_NE(moved.session, 0u);
  EXPECT_TRUE(moved.entries_dropped);
  // The new holder's host is now the one a later copy (another process) is compared with.
  EXPECT_TRUE(index_.Hello(Status("w1"), 9, 1, now_, {.peer_host = "10.0.0.5"}).id_in_use);
}

TEST_F(IndexTest, AConnectedHolderWhoseLeasePassedIsReplacedFromAnyPeerHost) {
  const uint64_t frozen = Join("w1", /*epoch=*/7, "10.0.0.5");
  now_ += kLease - absl::Milliseconds(1);
  EXPECT_TRUE(index_.Hello(Status("w1"), 8, 1, now_, {.peer_host = "10.0.0.6"}).id_in_use);
  now_ += absl::Milliseconds(1);  // the lease ends exactly now (not yet swept)
  const HelloResult moved = index_.Hello(Status("w1"), 8, 1, now_, {.peer_host = "10.0.0.6"});
  EXPECT_FALSE(moved.id_in_use);
  EXPECT_NE(moved.session, 0u);
  EXPECT_EQ(index_.Heartbeat("w1", frozen, 3, {}, now_).outcome, ApplyOutcome::kNoSession);
}

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

TEST(IndexLimitsTest, MaxWorkersRefusesNewWorkersButNotKnownOnes) {
  const absl::Time now = absl::FromUnixSeconds(1'700'000'000);
  DirectoryIndex index(kLease, IndexLimits{.max_workers = 2, .max_entries_per_worker = 10});
  EXPECT_FALSE(index.Hello(Status("a"), 1, 1, now).refused);
  EXPECT_FALSE(index.Hello(Status("b"), 1, 1, now).refused);
  const HelloResult c = index.Hello(Status("c"), 1, 1, now);
  EXPECT_TRUE(c.refused);
  EXPECT_EQ(c.session, 0u);
  EXPECT_EQ(index.Stats().workers, 2);
  EXPECT_FALSE(index.Hello(Status("a"), 2, 1, now).refused);  // a reconnect of a known worker
  // A lease that passed frees the place.
  index.ExpireLeases(now + kLease);
  EXPECT_FALSE(index.Hello(Status("c"), 1, 1, now + kLease).refused);
}

TEST(IndexLimitsTest, EntriesPastTheBoundDropTheWorkersEntries) {
  const absl::Time now = absl::FromUnixSeconds(1'700'000'000);
  DirectoryIndex index(kLease, IndexLimits{.max_workers = 4, .max_entries_per_worker = 3});
  const uint64_t s = index.Hello(Status("w"), 1, 1, now).session;
  const std::vector<DocEntry> three = {{Key(1), 10, kLazyOffset}, {Key(2), 10, kLazyOffset},
                                       {Key(2), 10, 64}};
  ASSERT_EQ(index.ApplySnapshot("w", s, 2, three, nullptr, now).outcome, ApplyOutcome::kApplied);
  EXPECT_EQ(index.Stats().entries, 3);
  // Replacing a held entry at the bound is fine; evicting one makes room for another.
  EXPECT_EQ(index.ApplyEvent("w", s, 3, Stored(1, 11), now).outcome, ApplyOutcome::kApplied);
  EXPECT_EQ(index.ApplyEvent("w", s, 4, Evicted(1), now).outcome, ApplyOutcome::kApplied);
  EXPECT_EQ(index.ApplyEvent("w", s, 5, Stored(3, 30), now).outcome, ApplyOutcome::kApplied);
  // A fourth distinct entry: refused, and the worker keeps nothing (it stays registered).
  EXPECT_EQ(index.ApplyEvent("w", s, 6, Stored(4, 40), now).outcome, ApplyOutcome::kOverLimit);
  EXPECT_EQ(index.Stats().entries, 0);
  EXPECT_EQ(index.Stats().documents, 0);
  EXPECT_EQ(index.Stats().workers, 1);
  // A snapshot over the bound: refused whole.
  const std::vector<DocEntry> four = {{Key(1), 1, kLazyOffset}, {Key(2), 1, kLazyOffset},
                                      {Key(3), 1, kLazyOffset}, {Key(4), 1, kLazyOffset}};
  EXPECT_EQ(index.ApplySnapshot("w", s, 7, four, nullptr, now).outcome, ApplyOutcome::kOverLimit);
  EXPECT_EQ(index.Stats().entries, 0);
}

TEST(IndexLimitsTest, ALargeWorkerLeavingGivesTheTableBack) {
  // Not observable through the interface except as memory; this checks the bookkeeping stays
  // right across the shrink (entries of the remaining worker still found).
  const absl::Time now = absl::FromUnixSeconds(1'700'000'000);
  DirectoryIndex index(kLease);
  const uint64_t big = index.Hello(Status("big"), 1, 1, now).session;
  std::vector<DocEntry> many;
  for (uint64_t k = 0; k < 50'000; ++k) many.push_back({Key(k + 100), 1, kLazyOffset});
  ASSERT_EQ(index.ApplySnapshot("big", big, 2, many, nullptr, now).outcome,
            ApplyOutcome::kApplied);
  const uint64_t small = index.Hello(Status("small"), 1, 1, now + kLease / 2).session;
  ASSERT_EQ(index.ApplySnapshot("small", small, 2, {{Key(1), 7, kLazyOffset}}, nullptr,
                                now + kLease / 2)
                .outcome,
            ApplyOutcome::kApplied);
  EXPECT_THAT(index.ExpireLeases(now + kLease), ElementsAre("big"));
  EXPECT_EQ(index.Stats().documents, 1);
  const auto r = index.Lookup({Key(1), Key(100)}, now + kLease);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].resident_tokens, 7);
  EXPECT_THAT(r[0].resident, ElementsAre(true, false));
}

}  // namespace
}  // namespace lazyattn::kvdir
