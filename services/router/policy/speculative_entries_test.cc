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

TEST(SpeculativeEntriesTest, ZeroTtlDisables) {
  SpeculativeEntries spec({.ttl = absl::ZeroDuration(), .max_keys = 10});
  spec.Record(std::vector<DocumentKey>{{1, 1}}, "w1", kT0);
  EXPECT_EQ(spec.size(), 0u);
}

}  // namespace
}  // namespace lazyattn::router
