// The caches keep their evictable entries apart (BlockPool::PinObserver) so that eviction never
// walks past pinned ones. These tests replay random insert / lookup / pin / unpin / evict
// sequences and compare every eviction with the walk the caches used to do: the LRU list (the
// document cache) or the leaves by last use (the prefix tree), skipping pinned entries.
#include <algorithm>
#include <functional>
#include <list>
#include <optional>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "services/worker/cache/kv_cache_manager.h"

namespace lazyattn {
namespace {

DocCacheKey Key(int i) { return {DocumentKeyFromText("m", "t", std::to_string(i)), 0}; }

// The document cache before: one LRU list, walked from the front past entries with a pinned block.
struct OldDocumentWalk {
  std::list<DocCacheKey> lru;
  void Used(const DocCacheKey& k) {
    lru.remove(k);
    lru.push_back(k);
  }
  std::optional<DocCacheKey> Oldest(const BlockPool& pool) const {
    for (const DocCacheKey& k : lru) {
      const auto blocks = blocks_of(k);
      if (std::all_of(blocks.begin(), blocks.end(),
                      [&](BlockId b) { return pool.ref_count(b) == 0; })) {
        return k;
      }
    }
    return std::nullopt;
  }
  std::function<std::vector<BlockId>(const DocCacheKey&)> blocks_of;  // the entry's blocks
};

TEST(EvictionOrderTest, DocumentCacheEvictsAsTheOldLruWalkOnRandomPins) {
  for (uint32_t seed = 1; seed <= 20; ++seed) {
    SCOPED_TRACE(seed);
    std::mt19937 rng(seed);
    KvCacheManager m(64, 16);
    DocumentCache& cache = m.documents();
    std::vector<DocCacheKey> evicted;
    cache.set_listener([&](const DocCacheKey& k, int64_t, bool stored) {
      if (!stored) evicted.push_back(k);
    });
    absl::flat_hash_map<int, std::vector<BlockId>> blocks;  // live entries
    std::vector<BlockId> pins;                              // one Unref owed per element
    OldDocumentWalk old;
    old.blocks_of = [&](const DocCacheKey& k) {
      for (const auto& [id, b] : blocks) {
        if (Key(id) == k) return b;
      }
      return std::vector<BlockId>{};
    };
    int next_id = 0;
    int evictions = 0;
    for (int op = 0; op < 600; ++op) {
      const int what = static_cast<int>(rng() % 10);
      if (what <= 2) {  // insert a document of 1-3 blocks, taken straight from the free list
        const int n = 1 + static_cast<int>(rng() % 3);
        if (m.pool().num_free() < n) continue;
        std::vector<BlockId> b;
        for (int i = 0; i < n; ++i) b.push_back(*m.pool().Allocate());
        const int id = next_id++;
        ASSERT_TRUE(cache.Insert(Key(id), b, 16 * n));
        old.Used(Key(id));
        // The encoding request lets go of some blocks at once, keeps the others pinned.
        for (BlockId x : b) {
          if (rng() % 4 != 0) {
            m.pool().Unref(x);
          } else {
            pins.push_back(x);
          }
        }
        blocks[id] = b;
      } else if (what <= 4 && !blocks.empty()) {  // a request hits a document and pins it all
        auto it = std::next(blocks.begin(), rng() % blocks.size());
        ASSERT_NE(cache.Lookup(Key(it->first)), nullptr);
        old.Used(Key(it->first));
        if (rng() % 2 == 0) {
          for (BlockId x : it->second) {
            m.pool().Ref(x);
            pins.push_back(x);
          }
        }
      } else if (what == 5 && !blocks.empty()) {  // a pin of one block only
        auto it = std::next(blocks.begin(), rng() % blocks.size());
        const BlockId x = it->second[rng() % it->second.size()];
        m.pool().Ref(x);
        pins.push_back(x);
      } else if (what <= 7 && !pins.empty()) {  // a request ends
        const size_t i = rng() % pins.size();
        m.pool().Unref(pins[i]);
        pins.erase(pins.begin() + static_cast<std::ptrdiff_t>(i));
      } else if (what >= 8) {  // eviction
        const std::optional<DocCacheKey> expected = old.Oldest(m.pool());
        const std::optional<uint64_t> age = cache.OldestEvictable();
        ASSERT_EQ(age.has_value(), expected.has_value());
        const size_t before = evicted.size();
        const int64_t freed = cache.EvictOne();
        if (!expected) {
          EXPECT_EQ(freed, 0);
          EXPECT_EQ(evicted.size(), before);
          continue;
        }
        ASSERT_EQ(evicted.size(), before + 1);
        EXPECT_EQ(evicted.back(), *expected);
        old.lru.remove(*expected);
        for (auto it = blocks.begin(); it != blocks.end(); ++it) {
          if (Key(it->first) == *expected) {
            EXPECT_EQ(freed, static_cast<int64_t>(it->second.size()));
            for (BlockId x : it->second) EXPECT_TRUE(m.pool().is_free(x));
            blocks.erase(it);
            break;
          }
        }
        ++evictions;
      }
      ASSERT_TRUE(m.CheckInvariant().ok()) << m.CheckInvariant();
    }
    EXPECT_GT(evictions, 20);
    for (BlockId x : pins) m.pool().Unref(x);
    EXPECT_TRUE(m.CheckInvariant().ok()) << m.CheckInvariant();
  }
}

// The prefix tree before: every leaf by last use, walked past leaves whose block is pinned.
std::optional<std::pair<uint64_t, BlockId>> OldPrefixWalk(const PrefixCache& tree,
                                                          const BlockPool& pool) {
  std::vector<std::pair<uint64_t, BlockId>> leaves;
  tree.ForEachLeaf([&](BlockId b, uint64_t last_use) { leaves.push_back({last_use, b}); });
  std::sort(leaves.begin(), leaves.end());
  for (const auto& leaf : leaves) {
    if (pool.ref_count(leaf.second) == 0) return leaf;
  }
  return std::nullopt;
}

TEST(EvictionOrderTest, PrefixTreeEvictsAsTheOldLeafWalkOnRandomPins) {
  constexpr int kB = 2;
  for (uint32_t seed = 1; seed <= 20; ++seed) {
    SCOPED_TRACE(seed);
    std::mt19937 rng(seed);
    KvCacheManager m(96, kB);
    PrefixCache& tree = m.prefixes();
    std::vector<std::vector<BlockId>> held;  // pins of running requests, one Unref each
    auto prompt = [&] {
      // A small alphabet and short prompts: many shared prefixes, branches and leaves.
      std::vector<int32_t> t(kB * (1 + rng() % 4));
      for (int32_t& x : t) x = static_cast<int32_t>(rng() % 2);
      return t;
    };
    int evictions = 0;
    for (int op = 0; op < 600; ++op) {
      const int what = static_cast<int>(rng() % 10);
      if (what <= 2) {  // a request reuses what is cached, computes the rest and records it
        const std::vector<int32_t> t = prompt();
        const size_t n = t.size() / kB;
        std::vector<BlockId> b =
            tree.MatchAndPin(t, static_cast<int64_t>(t.size()), m.Tick()).blocks;
        if (m.pool().num_free() < static_cast<int64_t>(n - b.size())) {
          for (BlockId x : b) m.pool().Unref(x);
          continue;
        }
        while (b.size() < n) b.push_back(*m.pool().Allocate());
        tree.Insert(t, b, m.Tick());
        if (rng() % 3 == 0) {
          held.push_back(b);  // still running
        } else {
          for (BlockId x : b) m.pool().Unref(x);
        }
      } else if (what <= 5) {  // a request reuses a prefix
        auto match = tree.MatchAndPin(prompt(), 8, m.Tick());
        if (!match.blocks.empty()) held.push_back(match.blocks);
      } else if (what == 6 && !held.empty()) {  // a request ends
        const size_t i = rng() % held.size();
        for (BlockId x : held[i]) m.pool().Unref(x);
        held.erase(held.begin() + static_cast<std::ptrdiff_t>(i));
      } else if (what >= 7) {
        const auto expected = OldPrefixWalk(tree, m.pool());
        const std::optional<uint64_t> age = tree.OldestEvictable();
        ASSERT_EQ(age.has_value(), expected.has_value());
        if (!expected) {
          EXPECT_EQ(tree.EvictOne(), 0);
          continue;
        }
        EXPECT_EQ(*age, expected->first);
        ASSERT_EQ(tree.EvictOne(), 1);
        EXPECT_TRUE(m.pool().is_free(expected->second)) << "evicted another leaf";
        ++evictions;
      }
      ASSERT_TRUE(m.CheckInvariant().ok()) << m.CheckInvariant();
    }
    EXPECT_GT(evictions, 20);
    for (const auto& h : held) {
      for (BlockId x : h) m.pool().Unref(x);
    }
    EXPECT_TRUE(m.CheckInvariant().ok()) << m.CheckInvariant();
  }
}

// Allocation picks between the caches by age as before; with every document pinned but one, the
// one unpinned document is found at once however many pinned ones are older.
TEST(EvictionOrderTest, AllocationSkipsManyPinnedDocumentsToTheOldestUnpinned) {
  KvCacheManager m(1001, 16);
  for (int d = 0; d < 1000; ++d) {
    const BlockId b = *m.pool().Allocate();
    ASSERT_TRUE(m.documents().Insert(Key(d), {b}, 16));
    if (d != 700) continue;  // every other document stays pinned by its request
    m.pool().Unref(b);
  }
  ASSERT_TRUE(m.Allocate());  // the last free block
  EXPECT_EQ(m.documents().num_entries(), 1000);
  ASSERT_TRUE(m.Allocate());  // evicts document 700
  EXPECT_FALSE(m.documents().Contains(Key(700)));
  EXPECT_EQ(m.documents().num_entries(), 999);
  EXPECT_FALSE(m.Allocate()) << "evicted a pinned document";
}

}  // namespace
}  // namespace lazyattn
