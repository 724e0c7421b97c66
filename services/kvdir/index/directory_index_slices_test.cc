// Large changes in slices (directory_index.h, "Large changes"): snapshots stored and retired
// entries erased a slice at a time with the lock released between, while lookups, other workers'
// snapshots, takeovers and sweeps run. Whatever interleaves, another worker's entries are never
// touched, and once every worker is gone nothing of them is left in the table.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "services/kvdir/index/directory_index_test_fixture.h"

namespace lazyattn::kvdir {
namespace {

using ::testing::ElementsAre;
using testing::Key;
using testing::kLease;
using testing::Status;

const absl::Time kT0 = absl::FromUnixSeconds(1'700'000'000);

std::vector<DocEntry> Range(uint64_t first, uint64_t count, int64_t tokens) {
  std::vector<DocEntry> out;
  for (uint64_t k = first; k < first + count; ++k) out.push_back({Key(k), tokens, kLazyOffset});
  return out;
}

// Many slices' worth (the slice is a few thousand entries), replacing the last snapshot whole.
TEST(IndexSlicesTest, ASnapshotOfManySlicesReplacesTheLastWhole) {
  DirectoryIndex index(kLease);
  const uint64_t w = index.Hello(Status("w"), 1, 1, kT0).session;
  const uint64_t other = index.Hello(Status("other"), 1, 1, kT0).session;
  ASSERT_EQ(index.ApplySnapshot("other", other, 2, Range(9'000, 2'000, 3), nullptr, kT0).outcome,
            ApplyOutcome::kApplied);
  ASSERT_EQ(index.ApplySnapshot("w", w, 2, Range(0, 10'000, 5), nullptr, kT0).outcome,
            ApplyOutcome::kApplied);
  EXPECT_EQ(index.Stats().entries, 12'000);
  ASSERT_EQ(index.ApplySnapshot("w", w, 3, Range(5'000, 10'000, 7), nullptr, kT0).outcome,
            ApplyOutcome::kApplied);
  EXPECT_EQ(index.Stats().entries, 12'000);
  EXPECT_EQ(index.Stats().documents, 10'000);  // 5,000..14,999 and other's 9,000..10,999 inside
  const std::vector<WorkerResidency> r = index.Lookup({Key(1), Key(14'999), Key(9'500)}, kT0);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].status.worker_id(), "other");
  EXPECT_THAT(r[0].resident, ElementsAre(false, false, true));
  EXPECT_EQ(r[1].status.worker_id(), "w");
  EXPECT_THAT(r[1].resident, ElementsAre(false, true, true));
  EXPECT_EQ(r[1].resident_tokens, 14);
  // A new epoch drops them all, and the table holds only other's.
  ASSERT_TRUE(index.Hello(Status("w"), 2, 1, kT0).entries_dropped);
  EXPECT_EQ(index.Stats().entries, 2'000);
  EXPECT_EQ(index.Stats().documents, 2'000);
}

// The room a snapshot's old entries held is reserved for it, and given back whole when it is
// refused or stores fewer.
TEST(IndexSlicesTest, ASnapshotsReservedRoomIsCountedOnceAndGivenBack) {
  DirectoryIndex index(kLease, IndexLimits{.max_entries = 10'000});
  const uint64_t a = index.Hello(Status("a"), 1, 1, kT0).session;
  const uint64_t b = index.Hello(Status("b"), 1, 1, kT0).session;
  ASSERT_EQ(index.ApplySnapshot("a", a, 2, Range(0, 6'000, 1), nullptr, kT0).outcome,
            ApplyOutcome::kApplied);
  ASSERT_EQ(index.ApplySnapshot("b", b, 2, Range(100'000, 4'000, 1), nullptr, kT0).outcome,
            ApplyOutcome::kApplied);
  EXPECT_EQ(index.Stats().entries, 10'000);  // full
  // The same entries again fit; fewer leave the rest of the room free.
  ASSERT_EQ(index.ApplySnapshot("a", a, 3, Range(0, 6'000, 1), nullptr, kT0).outcome,
            ApplyOutcome::kApplied);
  EXPECT_EQ(index.Stats().entries, 10'000);
  ASSERT_EQ(index.ApplySnapshot("a", a, 4, Range(0, 5'000, 1), nullptr, kT0).outcome,
            ApplyOutcome::kApplied);
  EXPECT_EQ(index.Stats().entries, 9'000);
  // More than the room: refused, a left with nothing, the reservation not kept.
  EXPECT_EQ(index.ApplySnapshot("a", a, 5, Range(0, 7'000, 1), nullptr, kT0).outcome,
            ApplyOutcome::kOverTotalLimit);
  EXPECT_EQ(index.Stats().entries, 4'000);
  ASSERT_EQ(index.ApplySnapshot("b", b, 3, Range(100'000, 10'000, 1), nullptr, kT0).outcome,
            ApplyOutcome::kApplied);
  EXPECT_EQ(index.Stats().entries, 10'000);
}

// A worker re-sending the entries it has while another stores at the bound between its slices:
// the other is refused, never the worker whose room it was.
TEST(IndexSlicesTest, AnotherWorkerCannotTakeTheRoomOfASnapshotBeingStored) {
  constexpr uint64_t kEntries = 20'000;  // several slices
  DirectoryIndex index(kLease, IndexLimits{.max_entries = kEntries + 100});
  const uint64_t a = index.Hello(Status("a"), 1, 1, kT0).session;
  const uint64_t b = index.Hello(Status("b"), 1, 1, kT0).session;
  ASSERT_EQ(index.ApplySnapshot("a", a, 2, Range(0, kEntries, 1), nullptr, kT0).outcome,
            ApplyOutcome::kApplied);
  ASSERT_EQ(index.ApplySnapshot("b", b, 2, Range(500'000, 100, 1), nullptr, kT0).outcome,
            ApplyOutcome::kApplied);
  ASSERT_EQ(index.Stats().entries, static_cast<int64_t>(kEntries + 100));  // full
  // b stores one entry between every two slices of a's work.
  uint64_t b_seq = 3, b_key = 1'000'000;
  int b_stored = 0, slices = 0;
  bool in_hook = false;
  index.SetBetweenSlicesHookForTest([&] {
    if (in_hook) return;  // b's own refusal erases in slices too
    in_hook = true;
    ++slices;
    b_stored += index.ApplyEvent("b", b, b_seq++, testing::Stored(b_key++, 1), kT0).outcome ==
                ApplyOutcome::kApplied;
    in_hook = false;
  });
  EXPECT_EQ(index.ApplySnapshot("a", a, 3, Range(0, kEntries, 1), nullptr, kT0).outcome,
            ApplyOutcome::kApplied);
  EXPECT_GT(slices, 5);      // b did store between them
  EXPECT_LE(b_stored, 100);  // b at most refills its own room, once refused and dropped
  EXPECT_LE(index.Stats().entries, static_cast<int64_t>(kEntries + 100));
  const std::vector<WorkerResidency> r = index.Lookup({Key(0), Key(kEntries - 1)}, kT0);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_THAT(r[0].resident, ElementsAre(true, true));  // a
}

// Once a snapshot fits, all of it is reserved: a larger one than the last is not refused partway
// because another worker filled the room between its slices.
TEST(IndexSlicesTest, ASnapshotThatFitsIsNotRefusedPartway) {
  constexpr uint64_t kEntries = 20'000;
  DirectoryIndex index(kLease, IndexLimits{.max_entries = kEntries + 5'000});
  const uint64_t a = index.Hello(Status("a"), 1, 1, kT0).session;
  const uint64_t b = index.Hello(Status("b"), 1, 1, kT0).session;
  ASSERT_EQ(index.ApplySnapshot("a", a, 2, Range(0, kEntries, 1), nullptr, kT0).outcome,
            ApplyOutcome::kApplied);
  ASSERT_EQ(index.ApplySnapshot("b", b, 2, {}, nullptr, kT0).outcome, ApplyOutcome::kApplied);
  uint64_t b_seq = 3, b_key = 1'000'000;
  int b_stored = 0;
  bool in_hook = false;
  index.SetBetweenSlicesHookForTest([&] {
    if (in_hook) return;
    // Only once a's new entries are being stored (its first slice holds key 0), so after its
    // size was checked.
    bool storing = false;
    for (const WorkerResidency& w : index.Lookup({Key(0)}, kT0)) {
      storing |= w.status.worker_id() == "a" && w.resident[0];
    }
    if (!storing) return;
    in_hook = true;
    // b fills exactly what is free (never refused, which would drop its entries and free room).
    const int64_t free = static_cast<int64_t>(kEntries + 5'000) - index.Stats().entries;
    for (int64_t i = 0; i < free; ++i) {
      b_stored += index.ApplyEvent("b", b, b_seq++, testing::Stored(b_key++, 1), kT0).outcome ==
                  ApplyOutcome::kApplied;
    }
    in_hook = false;
  });
  // a grows by 4,000: it fits when checked, and keeps fitting.
  EXPECT_EQ(index.ApplySnapshot("a", a, 3, Range(0, kEntries + 4'000, 1), nullptr, kT0).outcome,
            ApplyOutcome::kApplied);
  EXPECT_EQ(index.Stats().entries, static_cast<int64_t>(kEntries + 5'000));
  EXPECT_EQ(b_stored, 1'000);  // the room a's snapshot did not need
}

// A worker restarted (a new epoch) holds nothing from its hello on, while its old entries are
// still being erased.
TEST(IndexSlicesTest, RetiredEntriesAreHiddenWhileTheyAreErased) {
  DirectoryIndex index(kLease);
  ASSERT_EQ(index
                .ApplySnapshot("a", index.Hello(Status("a"), 1, 1, kT0).session, 2,
                               Range(0, 20'000, 1), nullptr, kT0)
                .outcome,
            ApplyOutcome::kApplied);
  int lookups = 0, seen = 0;
  index.SetBetweenSlicesHookForTest([&] {
    ++lookups;
    for (const WorkerResidency& w : index.Lookup({Key(0), Key(19'999), Key(7'777)}, kT0)) {
      for (bool resident : w.resident) seen += resident;
    }
  });
  ASSERT_TRUE(index.Hello(Status("a"), 2, 1, kT0).entries_dropped);
  EXPECT_GT(lookups, 5);
  EXPECT_EQ(seen, 0) << "a restarted worker's old entries were visible while being erased";
  EXPECT_EQ(index.Stats().documents, 0);
}

// Threads as kvdir has them: a steady worker's stream, workers re-snapshotting, a worker
// restarting (new epoch) and one reconnecting mid-snapshot (a takeover), the sweeper, and
// routers' lookups. The steady worker's entries read right in every lookup, and when all have
// expired the table is empty: no retired holding was left behind or erased twice.
TEST(IndexSlicesTest, EverythingInterleavedLeavesOthersAloneAndNothingBehind) {
  DirectoryIndex index(absl::Hours(1));
  const uint64_t steady = index.Hello(Status("steady"), 1, 1, kT0).session;
  ASSERT_EQ(index.ApplySnapshot("steady", steady, 2, Range(0, 100, 11), nullptr, kT0).outcome,
            ApplyOutcome::kApplied);
  constexpr int kRounds = 12;
  constexpr uint64_t kEntries = 12'000;  // three slices or more
  std::atomic<bool> done{false};
  std::atomic<int64_t> lookups{0}, wrong{0};
  std::vector<std::thread> threads;
  // Two workers sharing keys with each other and with "steady" (keys 50..).
  for (int i = 0; i < 2; ++i) {
    threads.emplace_back([&, i] {
      const std::string id = "snapshotter-" + std::to_string(i);
      const uint64_t session = index.Hello(Status(id), 1, 1, kT0).session;
      uint64_t seq = 2;
      for (int round = 0; round < kRounds; ++round) {
        EXPECT_EQ(index
                      .ApplySnapshot(id, session, seq++, Range(50 + round * 100, kEntries, 2),
                                     nullptr, kT0)
                      .outcome,
                  ApplyOutcome::kApplied);
      }
    });
  }
  threads.emplace_back([&] {  // restarts: each hello a new epoch, retiring the last snapshot
    for (int round = 0; round < kRounds; ++round) {
      const uint64_t session = index.Hello(Status("restarter"), 100 + round, 1, kT0).session;
      (void)index.ApplySnapshot("restarter", session, 2, Range(60, kEntries, 3), nullptr, kT0);
    }
  });
  threads.emplace_back([&] {  // one process reconnecting: a new session takes over each time
    for (int round = 0; round < kRounds; ++round) {
      const uint64_t session = index.Hello(Status("mover"), 7, 1, kT0).session;
      const ApplyOutcome outcome =
          index.ApplySnapshot("mover", session, 2, Range(70, kEntries, 4), nullptr, kT0).outcome;
      EXPECT_TRUE(outcome == ApplyOutcome::kApplied || outcome == ApplyOutcome::kNoSession);
    }
  });
  threads.emplace_back([&] {  // the mover's reconnects, racing its own snapshots
    for (int round = 0; round < kRounds; ++round) {
      (void)index.Hello(Status("mover"), 7, 1, kT0);
      std::this_thread::yield();
    }
  });
  std::thread sweeper([&] {
    while (!done) (void)index.Sweep(kT0);
  });
  std::thread router([&] {
    while (!done) {
      const std::vector<WorkerResidency> r = index.Lookup({Key(0), Key(99), Key(100)}, kT0);
      ++lookups;
      bool found = false;
      for (const WorkerResidency& w : r) {
        if (w.status.worker_id() != "steady") continue;
        found = true;
        if (w.resident != std::vector<bool>{true, true, false} || w.resident_tokens != 22) ++wrong;
      }
      if (!found) ++wrong;
    }
  });
  for (std::thread& t : threads) t.join();
  done = true;
  sweeper.join();
  router.join();
  EXPECT_GT(lookups.load(), 0);
  EXPECT_EQ(wrong.load(), 0) << "lookups that saw the steady worker's entries wrong";
  EXPECT_EQ(index.Stats().workers, 5);
  // Everyone expires: every holding, live or retired, must be gone.
  EXPECT_EQ(index.ExpireLeases(kT0 + absl::Hours(2)).size(), 5u);
  EXPECT_EQ(index.Stats().entries, 0);
  EXPECT_EQ(index.Stats().documents, 0);
}

}  // namespace
}  // namespace lazyattn::kvdir
