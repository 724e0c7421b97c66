#include "services/worker/cache/prefix_cache.h"

#include <numeric>

#include "gtest/gtest.h"
#include "services/worker/cache/kv_cache_manager.h"

namespace lazyattn {
namespace {

TEST(PrefixCacheTest, MatchesWholeBlocksOfTheLongestCachedPrefix) {
  KvCacheManager m(16, 4);
  std::vector<int32_t> a(10);
  std::iota(a.begin(), a.end(), 0);  // 0..9: two full blocks and a partial one
  std::vector<BlockId> blocks = {*m.Allocate(), *m.Allocate(), *m.Allocate()};
  m.prefixes().Insert(a, blocks, m.Tick());
  EXPECT_EQ(m.prefixes().num_blocks(), 2);  // the partial block is not shared
  for (BlockId b : blocks) m.pool().Unref(b);
  EXPECT_TRUE(m.pool().is_free(blocks[2]));

  std::vector<int32_t> b = {0, 1, 2, 3, 4, 5, 6, 99, 8, 9};  // diverges inside block 2
  auto match = m.prefixes().MatchAndPin(b, 100, m.Tick());
  EXPECT_EQ(match.num_tokens, 4);
  ASSERT_EQ(match.blocks.size(), 1u);
  EXPECT_EQ(match.blocks[0], blocks[0]);
  EXPECT_EQ(m.pool().ref_count(blocks[0]), 1);
  // max_tokens caps the match (the last prompt token is always computed).
  auto capped = m.prefixes().MatchAndPin(a, 7, m.Tick());
  EXPECT_EQ(capped.num_tokens, 4);
  for (BlockId x : match.blocks) m.pool().Unref(x);
  for (BlockId x : capped.blocks) m.pool().Unref(x);
  EXPECT_TRUE(m.CheckInvariant().ok()) << m.CheckInvariant();
}

// A prefix inserted under one cache scope matches only requests of that scope: another scope, and
// the shared one, see none of it (and compute their own blocks, which then live beside it).
TEST(PrefixCacheTest, PrefixesMatchOnlyWithinTheirScope) {
  KvCacheManager m(16, 4);
  const std::vector<int32_t> tokens = {1, 2, 3, 4, 5, 6, 7, 8};
  const std::vector<int32_t> scope_a = {11, 12}, scope_b = {11, 13};
  const std::vector<BlockId> a_blocks = {*m.Allocate(), *m.Allocate()};
  m.prefixes().Insert(tokens, a_blocks, m.Tick(), scope_a);
  for (BlockId b : a_blocks) m.pool().Unref(b);

  EXPECT_EQ(m.prefixes().MatchAndPin(tokens, 100, m.Tick(), scope_b).num_tokens, 0);
  EXPECT_EQ(m.prefixes().MatchAndPin(tokens, 100, m.Tick()).num_tokens, 0);
  // Scope words are not tokens: a request whose own tokens begin with them matches nothing.
  std::vector<int32_t> spelled = scope_a;
  spelled.insert(spelled.end(), tokens.begin(), tokens.end());
  EXPECT_EQ(m.prefixes().MatchAndPin(spelled, 100, m.Tick()).num_tokens, 0);

  auto same = m.prefixes().MatchAndPin(tokens, 100, m.Tick(), scope_a);
  EXPECT_EQ(same.num_tokens, 8);
  EXPECT_EQ(same.blocks, a_blocks);
  for (BlockId b : same.blocks) m.pool().Unref(b);

  // The shared scope's copy lives beside it, and evicting one leaves the other.
  const std::vector<BlockId> shared_blocks = {*m.Allocate(), *m.Allocate()};
  m.prefixes().Insert(tokens, shared_blocks, m.Tick());
  for (BlockId b : shared_blocks) m.pool().Unref(b);
  EXPECT_EQ(m.prefixes().num_blocks(), 4);
  EXPECT_EQ(m.prefixes().EvictOne(), 1);  // scope a's leaf, the older
  auto a_left = m.prefixes().MatchAndPin(tokens, 100, m.Tick(), scope_a);
  EXPECT_EQ(a_left.num_tokens, 4);
  auto shared = m.prefixes().MatchAndPin(tokens, 100, m.Tick());
  EXPECT_EQ(shared.num_tokens, 8);
  for (BlockId b : a_left.blocks) m.pool().Unref(b);
  for (BlockId b : shared.blocks) m.pool().Unref(b);
  EXPECT_TRUE(m.prefixes().CheckEvictable().ok()) << m.prefixes().CheckEvictable();
  EXPECT_TRUE(m.CheckInvariant().ok()) << m.CheckInvariant();
}

TEST(PrefixCacheTest, EvictsLeavesFirstAndNeverPinnedOnes) {
  KvCacheManager m(3, 2);
  std::vector<int32_t> t = {1, 2, 3, 4};
  std::vector<BlockId> blocks = {*m.Allocate(), *m.Allocate()};
  m.prefixes().Insert(t, blocks, m.Tick());
  for (BlockId b : blocks) m.pool().Unref(b);
  auto pin = m.prefixes().MatchAndPin(t, 2, m.Tick());  // pins the root block only
  ASSERT_EQ(pin.blocks.size(), 1u);
  EXPECT_TRUE(m.Allocate());  // the free block
  EXPECT_TRUE(m.Allocate());  // evicts the leaf {3, 4}
  EXPECT_FALSE(m.Allocate()) << "evicted a pinned block";
  EXPECT_EQ(m.prefixes().num_blocks(), 1);
}

// Two requests computed the same second block at once, each in its own block; the second to
// insert has a third block. It is not hung under the first request's node (unpinned, that node
// would be counted evictable and never be, while the third is held): it stays the request's own,
// and is freed with it.
TEST(PrefixCacheTest, AnInsertStopsWhereAnotherRequestsBlockHoldsTheTokens) {
  KvCacheManager m(8, 2);
  const std::vector<int32_t> shared = {1, 2, 3, 4};
  const std::vector<int32_t> longer = {1, 2, 3, 4, 5, 6};
  const std::vector<BlockId> first = {*m.Allocate(), *m.Allocate()};
  m.prefixes().Insert(shared, first, m.Tick());
  // The second request matched only the root block, then computed {3, 4} and {5, 6} itself.
  const std::vector<BlockId> second = {first[0], *m.Allocate(), *m.Allocate()};
  m.pool().Ref(first[0]);
  m.prefixes().Insert(longer, second, m.Tick());
  EXPECT_EQ(m.prefixes().num_blocks(), 2) << "the second request's blocks were cached";
  for (BlockId b : first) m.pool().Unref(b);
  for (BlockId b : second) m.pool().Unref(b);
  EXPECT_TRUE(m.pool().is_free(second[1]));
  EXPECT_TRUE(m.pool().is_free(second[2]));
  // The first request's {3, 4} is an evictable leaf: every block can be had.
  for (int i = 0; i < 8; ++i) EXPECT_TRUE(m.Allocate()) << i;
  EXPECT_TRUE(m.CheckInvariant().ok()) << m.CheckInvariant();
}

}  // namespace
}  // namespace lazyattn

namespace lazyattn {
namespace {

TEST(PrefixCacheTest, EvictsLeastRecentlyUsedLeafAmongMany) {
  // Three branches of two blocks each; touching a branch protects it from the next eviction.
  KvCacheManager m(6, 2);
  std::vector<std::vector<int32_t>> prompts = {{1, 1, 1, 1}, {2, 2, 2, 2}, {3, 3, 3, 3}};
  std::vector<std::vector<BlockId>> blocks;
  for (const auto& p : prompts) {
    blocks.push_back({*m.Allocate(), *m.Allocate()});
    m.prefixes().Insert(p, blocks.back(), m.Tick());
    for (BlockId b : blocks.back()) m.pool().Unref(b);
  }
  auto touch = m.prefixes().MatchAndPin(prompts[0], 4, m.Tick());  // branch 1 becomes newest
  for (BlockId b : touch.blocks) m.pool().Unref(b);
  EXPECT_EQ(m.prefixes().EvictOne(), 1);  // branch 2's leaf, the oldest now
  EXPECT_EQ(m.prefixes().MatchAndPin(prompts[1], 4, m.Tick()).num_tokens, 2);
  EXPECT_EQ(m.prefixes().MatchAndPin(prompts[0], 4, m.Tick()).num_tokens, 4);
}

}  // namespace
}  // namespace lazyattn
