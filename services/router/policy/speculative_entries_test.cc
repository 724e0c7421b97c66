#include "services/router/policy/speculative_entries.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace lazyattn::router {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;

const absl::Time kT0 = absl::FromUnixSeconds(1000);

TEST(SpeculativeEntriesTest, ExpireAfterTtl) {
  SpeculativeEntries spec({.ttl = absl::Seconds(2), .max_keys = 10});
  const DocumentKey k{1, 2};
  spec.Record(std::vector<DocumentKey>{k}, "w1", kT0);
  EXPECT_THAT(spec.Holders(k, kT0 + absl::Milliseconds(1999)), ElementsAre("w1"));
  EXPECT_THAT(spec.Holders(k, kT0 + absl::Seconds(2)), IsEmpty());
}

TEST(SpeculativeEntriesTest, RecordingAgainRefreshesAndAddsHolders) {
  SpeculativeEntries spec({.ttl = absl::Seconds(2), .max_keys = 10});
  const DocumentKey k{1, 2};
  spec.Record(std::vector<DocumentKey>{k}, "w1", kT0);
  spec.Record(std::vector<DocumentKey>{k}, "w2", kT0 + absl::Seconds(1));
  spec.Record(std::vector<DocumentKey>{k}, "w1", kT0 + absl::Seconds(1));
  EXPECT_THAT(spec.Holders(k, kT0 + absl::Milliseconds(2500)), UnorderedElementsAre("w1", "w2"));
  EXPECT_EQ(spec.size(), 1u);
}

TEST(SpeculativeEntriesTest, BoundedBySweepingExpiredKeys) {
  SpeculativeEntries spec({.ttl = absl::Seconds(2), .max_keys = 2});
  spec.Record(std::vector<DocumentKey>{{1, 1}, {2, 2}}, "w1", kT0);
  // Full and nothing expired: the new key is not recorded.
  spec.Record(std::vector<DocumentKey>{{3, 3}}, "w1", kT0 + absl::Seconds(1));
  EXPECT_EQ(spec.size(), 2u);
  EXPECT_THAT(spec.Holders({3, 3}, kT0 + absl::Seconds(1)), IsEmpty());
  // Once the old ones expired they make room.
  spec.Record(std::vector<DocumentKey>{{3, 3}}, "w1", kT0 + absl::Seconds(3));
  EXPECT_EQ(spec.size(), 1u);
  EXPECT_THAT(spec.Holders({3, 3}, kT0 + absl::Seconds(3)), ElementsAre("w1"));
}

// A full table is swept at most every kFullSweepInterval (250 ms), not on every Record: a key
// that expired since the last sweep makes room only at the next one.
TEST(SpeculativeEntriesTest, AFullTableIsSweptAtMostEveryQuarterSecond) {
  SpeculativeEntries spec({.ttl = absl::Seconds(2), .max_keys = 2});
  spec.Record(std::vector<DocumentKey>{{1, 1}}, "w1", kT0, absl::Milliseconds(10));
  spec.Record(std::vector<DocumentKey>{{2, 2}}, "w1", kT0);
  // Full; this sweep finds nothing expired, and the next may run at 251 ms.
  spec.Record(std::vector<DocumentKey>{{3, 3}}, "w1", kT0 + absl::Milliseconds(1));
  EXPECT_THAT(spec.Holders({3, 3}, kT0 + absl::Milliseconds(1)), IsEmpty());
  // Key 1 expired at 10 ms, but no sweep runs before 251 ms: no room yet.
  spec.Record(std::vector<DocumentKey>{{4, 4}}, "w1", kT0 + absl::Milliseconds(20));
  EXPECT_THAT(spec.Holders({4, 4}, kT0 + absl::Milliseconds(20)), IsEmpty());
  EXPECT_EQ(spec.size(), 2u);
  spec.Record(std::vector<DocumentKey>{{4, 4}}, "w1", kT0 + absl::Milliseconds(251));
  EXPECT_THAT(spec.Holders({4, 4}, kT0 + absl::Milliseconds(251)), ElementsAre("w1"));
  EXPECT_EQ(spec.size(), 2u);
}

TEST(SpeculativeEntriesTest, ZeroTtlDisables) {
  SpeculativeEntries spec({.ttl = absl::ZeroDuration(), .max_keys = 10});
  spec.Record(std::vector<DocumentKey>{{1, 1}}, "w1", kT0);
  EXPECT_EQ(spec.size(), 0u);
}

}  // namespace
}  // namespace lazyattn::router
