// DirectoryIndex lookups: stored and evicted entries as Lookup sees them (tokens summed per worker,
// entries per offset, repeated keys), and the residency rule of each cache mode (lazy, block with
// its offsets and copyable tokens, prefix, any entry).
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
using testing::IndexTest;
using testing::Key;
using testing::Pair;
using testing::Status;
using testing::Stored;

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

}  // namespace
}  // namespace lazyattn::kvdir
