// DirectoryIndex bounds (IndexLimits): max_workers refuses new workers but not known ones, entries
// past max_entries_per_worker (or all workers' past max_entries) drop the worker's entries, and a
// large worker leaving shrinks the table without losing the others' entries, and a document stored
// at more offsets than max_offsets_per_document keeps its newest ones.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "services/kvdir/index/directory_index.h"
#include "services/kvdir/index/directory_index_test_fixture.h"

namespace lazyattn::kvdir {
namespace {

using ::testing::ElementsAre;
using testing::Evicted;
using testing::Key;
using testing::kLease;
using testing::Status;
using testing::Stored;

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

// max_entries bounds all workers' entries together (a few workers with valid certificates, or
// many honest ones with large caches, would otherwise fill the directory's memory): the worker
// whose store or snapshot goes past it loses its entries; the others keep theirs.
TEST(IndexLimitsTest, EntriesPastTheTotalBoundDropTheEntriesOfTheWorkerGoingPastIt) {
  const absl::Time now = absl::FromUnixSeconds(1'700'000'000);
  DirectoryIndex index(
      kLease, IndexLimits{.max_workers = 4, .max_entries_per_worker = 10, .max_entries = 5});
  const uint64_t a = index.Hello(Status("a"), 1, 1, now).session;
  const uint64_t b = index.Hello(Status("b"), 1, 1, now).session;
  const std::vector<DocEntry> three = {
      {Key(1), 10, kLazyOffset}, {Key(2), 10, kLazyOffset}, {Key(3), 10, kLazyOffset}};
  ASSERT_EQ(index.ApplySnapshot("a", a, 2, three, nullptr, now).outcome, ApplyOutcome::kApplied);
  ASSERT_EQ(index.ApplySnapshot("b", b, 2, {}, nullptr, now).outcome, ApplyOutcome::kApplied);
  EXPECT_EQ(index.ApplyEvent("b", b, 3, Stored(4, 40), now).outcome, ApplyOutcome::kApplied);
  EXPECT_EQ(index.ApplyEvent("b", b, 4, Stored(5, 50), now).outcome, ApplyOutcome::kApplied);
  EXPECT_EQ(index.Stats().entries, 5);
  // At the bound a replacement is fine; a sixth entry is not.
  EXPECT_EQ(index.ApplyEvent("b", b, 5, Stored(5, 51), now).outcome, ApplyOutcome::kApplied);
  EXPECT_EQ(index.ApplyEvent("b", b, 6, Stored(6, 60), now).outcome, ApplyOutcome::kOverTotalLimit);
  EXPECT_EQ(index.Stats().entries, 3);  // a's
  EXPECT_EQ(index.Stats().workers, 2);
  // A snapshot that would go past it is refused whole, before anything is stored.
  EXPECT_EQ(index.ApplySnapshot("b", b, 7, three, nullptr, now).outcome,
            ApplyOutcome::kOverTotalLimit);
  EXPECT_EQ(index.Stats().entries, 3);
  const std::vector<DocEntry> two(three.begin(), three.begin() + 2);
  EXPECT_EQ(index.ApplySnapshot("b", b, 8, two, nullptr, now).outcome, ApplyOutcome::kApplied);
  EXPECT_EQ(index.Stats().entries, 5);
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

// Which of `offsets` of Key(1) worker "w" holds, as a mode block request placing it there sees.
std::vector<bool> BlockResidency(const DirectoryIndex& index, const std::vector<int64_t>& offsets,
                                 absl::Time now) {
  std::vector<bool> out;
  for (int64_t offset : offsets) {
    const std::vector<WorkerResidency> r =
        index.Lookup({Key(1)}, ResidencyRule::kBlock, {offset}, now);
    out.push_back(r.size() == 1 && r[0].resident[0]);
  }
  return out;
}

TEST(IndexLimitsTest, ADocumentAtTooManyOffsetsKeepsItsNewest) {
  const absl::Time now = absl::FromUnixSeconds(1'700'000'000);
  DirectoryIndex index(
      kLease,
      IndexLimits{.max_workers = 4, .max_entries_per_worker = 100, .max_offsets_per_document = 4});
  const uint64_t s = index.Hello(Status("w"), 1, 1, now).session;
  std::vector<DocEntry> ten;
  for (int64_t offset = 0; offset < 10; ++offset) ten.push_back({Key(1), 10, offset * 16});
  ASSERT_EQ(index.ApplySnapshot("w", s, 2, ten, nullptr, now).outcome, ApplyOutcome::kApplied);
  EXPECT_EQ(index.Stats().entries, 4);
  EXPECT_THAT(BlockResidency(index, {80, 96, 112, 128, 144}, now),
              ElementsAre(false, true, true, true, true));
  // A new offset replaces the oldest; a held one is replaced in place; an eviction frees a place.
  EXPECT_EQ(index.ApplyEvent("w", s, 3, Stored(1, 10, 160), now).outcome, ApplyOutcome::kApplied);
  EXPECT_EQ(index.ApplyEvent("w", s, 4, Stored(1, 12, 160), now).outcome, ApplyOutcome::kApplied);
  EXPECT_EQ(index.Stats().entries, 4);
  EXPECT_THAT(BlockResidency(index, {96, 112, 160}, now), ElementsAre(false, true, true));
  EXPECT_EQ(index.ApplyEvent("w", s, 5, Evicted(1, 112), now).outcome, ApplyOutcome::kApplied);
  EXPECT_EQ(index.ApplyEvent("w", s, 6, Stored(1, 10, 176), now).outcome, ApplyOutcome::kApplied);
  EXPECT_EQ(index.Stats().entries, 4);
  EXPECT_THAT(BlockResidency(index, {128, 144, 160, 176}, now),
              ElementsAre(true, true, true, true));
  // Another document still counts against the worker's own bound as before.
  EXPECT_EQ(index.ApplyEvent("w", s, 7, Stored(2, 10), now).outcome, ApplyOutcome::kApplied);
  EXPECT_EQ(index.Stats().entries, 5);
}

// The same with the default limits and a snapshot as large as a worker may send, all of one
// document: it is applied (each store walks at most 64 offsets, not every earlier one).
TEST(IndexLimitsTest, ASnapshotOfOneDocumentAtEveryOffsetIsBounded) {
  const absl::Time now = absl::FromUnixSeconds(1'700'000'000);
  DirectoryIndex index(kLease);
  const uint64_t s = index.Hello(Status("w"), 1, 1, now).session;
  std::vector<DocEntry> entries;
  for (int64_t offset = 0; offset < index.limits().max_entries_per_worker; ++offset) {
    entries.push_back({Key(1), 10, offset});
  }
  ASSERT_EQ(index.ApplySnapshot("w", s, 2, entries, nullptr, now).outcome, ApplyOutcome::kApplied);
  EXPECT_EQ(index.Stats().entries, index.limits().max_offsets_per_document);
  const int64_t last = index.limits().max_entries_per_worker - 1;
  EXPECT_THAT(BlockResidency(index, {0, last - 64, last - 63, last}, now),
              ElementsAre(false, false, true, true));
}

}  // namespace
}  // namespace lazyattn::kvdir
