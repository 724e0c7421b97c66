#include "services/worker/cache/document_cache.h"

#include "gtest/gtest.h"
#include "services/worker/cache/kv_cache_manager.h"

namespace lazyattn {
namespace {

DocCacheKey Key(int i, int64_t offset = DocCacheKey::kAnyOffset) {
  return {DocumentKeyFromText("m", "t", std::to_string(i)), offset};
}

std::vector<BlockId> Take(KvCacheManager& m, int n) {
  std::vector<BlockId> blocks;
  for (int i = 0; i < n; ++i) blocks.push_back(*m.Allocate());
  return blocks;
}

TEST(DocumentCacheTest, LruEvictionSkipsPinnedEntries) {
  KvCacheManager m(6, 16);
  std::vector<std::pair<DocCacheKey, bool>> events;
  m.documents().set_listener([&](const DocCacheKey& k, int64_t, bool stored) {
    events.push_back({k, stored});
  });
  for (int d = 0; d < 3; ++d) {
    auto blocks = Take(m, 2);
    ASSERT_TRUE(m.documents().Insert(Key(d), blocks, 20));
    for (BlockId b : blocks) m.pool().Unref(b);  // the encoding sequence is done
  }
  EXPECT_EQ(m.pool().num_free(), 0);
  // Doc 0 is the oldest, but a request pins it: eviction takes doc 1 instead.
  const CachedDocument* d0 = m.documents().Lookup(Key(0));
  ASSERT_NE(d0, nullptr);
  EXPECT_EQ(d0->hits, 1);
  for (BlockId b : d0->blocks) m.pool().Ref(b);
  m.documents().Lookup(Key(2));  // refresh doc 2
  auto b = m.Allocate();
  ASSERT_TRUE(b);
  EXPECT_FALSE(m.documents().Contains(Key(1)));
  EXPECT_TRUE(m.documents().Contains(Key(0)));
  EXPECT_TRUE(m.documents().Contains(Key(2)));
  ASSERT_EQ(events.size(), 4u);
  EXPECT_EQ(events.back().first, Key(1));
  EXPECT_FALSE(events.back().second);
  EXPECT_TRUE(m.CheckInvariant().ok()) << m.CheckInvariant();
}

TEST(DocumentCacheTest, BlockModeKeysCarryTheOffset) {
  KvCacheManager m(8, 16);
  auto blocks = Take(m, 2);
  ASSERT_TRUE(m.documents().Insert(Key(7, 100), blocks, 20));
  EXPECT_EQ(m.documents().Lookup(Key(7, 200)), nullptr);
  EXPECT_EQ(m.documents().Lookup(Key(7)), nullptr);
  DocCacheKey found;
  ASSERT_NE(m.documents().FindAnyOffset(Key(7).doc, &found), nullptr);
  EXPECT_EQ(found.offset, 100);
  EXPECT_FALSE(m.documents().Insert(Key(7, 100), {}, 0)) << "duplicate insert accepted";
  // With several offsets cached, the lowest is chosen, a position-agnostic entry first.
  ASSERT_TRUE(m.documents().Insert(Key(7, 40), {*m.Allocate()}, 10));
  ASSERT_NE(m.documents().FindAnyOffset(Key(7).doc, &found), nullptr);
  EXPECT_EQ(found.offset, 40);
  ASSERT_TRUE(m.documents().Insert(Key(7), {*m.Allocate()}, 10));
  ASSERT_NE(m.documents().FindAnyOffset(Key(7).doc, &found), nullptr);
  EXPECT_EQ(found.offset, DocCacheKey::kAnyOffset);
}

// Block mode copies an entry to a new offset by re-rotating its keys, one more rounding; a copy
// of a copy would be two, and chains longer. Only computed entries are copied from, even where a
// copy sits at a lower offset, and a document whose computed entries are gone has none.
TEST(DocumentCacheTest, CopiesAreNeverCopiedFrom) {
  KvCacheManager m(8, 16);
  const std::vector<BlockId> computed = Take(m, 1), copied = Take(m, 1);
  ASSERT_TRUE(m.documents().Insert(Key(7, 100), computed, 10));
  ASSERT_TRUE(m.documents().Insert(Key(7, 20), copied, 10, DocumentCache::Origin::kCopied));
  DocCacheKey found;
  ASSERT_NE(m.documents().FindAnyOffset(Key(7).doc, &found), nullptr);
  EXPECT_EQ(found.offset, 100) << "a copy was chosen as the source";
  EXPECT_TRUE(m.documents().HasCopySource(Key(7).doc));
  // The computed entry leaves (evicted); the copy stays but is no source.
  m.pool().Unref(computed[0]);
  m.pool().Unref(copied[0]);
  m.documents().Lookup(Key(7, 20));  // the copy is the most recent: the computed one goes first
  ASSERT_EQ(m.documents().EvictOne(), 1);
  EXPECT_FALSE(m.documents().Contains(Key(7, 100)));
  EXPECT_TRUE(m.documents().Contains(Key(7, 20)));
  EXPECT_EQ(m.documents().FindAnyOffset(Key(7).doc, &found), nullptr);
  EXPECT_FALSE(m.documents().HasCopySource(Key(7).doc));
  EXPECT_TRUE(m.CheckInvariant().ok()) << m.CheckInvariant();
}

}  // namespace
}  // namespace lazyattn
