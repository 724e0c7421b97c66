// The token-id cache of text documents, alone and behind Engine::Submit.
#include "services/worker/engine/document_token_cache.h"

#include <thread>

#include "gtest/gtest.h"
#include "services/worker/engine/engine.h"
#include "services/worker/engine/request_prep.h"
#include "services/worker/model/model_fingerprint.h"
#include "services/worker/model/random_weights.h"
#include "services/worker/model/tokenizer/byte_tokenizer.h"

namespace lazyattn {
namespace {

DocumentKey Key(uint64_t i) { return DocumentKey{.hi = i, .lo = ~i}; }
std::vector<int32_t> Ids(int n, int32_t first) {
  std::vector<int32_t> v(n);
  for (int i = 0; i < n; ++i) v[i] = first + i;
  return v;
}

TEST(DocumentTokenCacheTest, EvictsLeastRecentlyUsedBeyondTheBudget) {
  DocumentTokenCache cache(10, /*entry_overhead_tokens=*/0);
  cache.Insert(Key(1), Ids(4, 100));
  cache.Insert(Key(2), Ids(4, 200));
  ASSERT_TRUE(cache.Find(Key(1)).has_value());  // 1 is now the most recent
  cache.Insert(Key(3), Ids(4, 300));            // 12 > 10: 2 goes
  EXPECT_EQ(cache.Find(Key(2)), std::nullopt);
  EXPECT_EQ(cache.Find(Key(1)), Ids(4, 100));
  EXPECT_EQ(cache.Find(Key(3)), Ids(4, 300));
  EXPECT_EQ(cache.tokens(), 8);
  EXPECT_EQ(cache.entries(), 2);
  EXPECT_EQ(cache.hits(), 3);
  EXPECT_EQ(cache.misses(), 1);
}

TEST(DocumentTokenCacheTest, ReplacesAKeyAndSkipsWhatCannotFit) {
  DocumentTokenCache cache(10, /*entry_overhead_tokens=*/0);
  cache.Insert(Key(1), Ids(4, 100));
  cache.Insert(Key(1), Ids(6, 500));
  EXPECT_EQ(cache.Find(Key(1)), Ids(6, 500));
  EXPECT_EQ(cache.tokens(), 6);
  cache.Insert(Key(2), Ids(11, 0));  // larger than the whole budget: not kept, evicts nothing
  EXPECT_EQ(cache.Find(Key(2)), std::nullopt);
  EXPECT_EQ(cache.entries(), 1);
  DocumentTokenCache off(0);
  off.Insert(Key(1), Ids(1, 0));
  EXPECT_EQ(off.Find(Key(1)), std::nullopt);
  EXPECT_EQ(off.tokens(), 0);
}

// Each entry is charged its bookkeeping besides its ids: one-token documents fill the budget after
// a few entries instead of holding one entry per budgeted id.
TEST(DocumentTokenCacheTest, ManySmallDocumentsAreChargedTheirBookkeeping) {
  constexpr int64_t kCapacity = 1 << 16;
  constexpr int64_t kCharge = 1 + DocumentTokenCache::kEntryOverheadTokens;
  DocumentTokenCache cache(kCapacity);
  for (int i = 0; i < 20000; ++i) cache.Insert(Key(i), Ids(1, i));
  EXPECT_EQ(cache.entries(), kCapacity / kCharge);
  EXPECT_EQ(cache.tokens(), kCapacity / kCharge);
  EXPECT_EQ(cache.charged(), cache.entries() * kCharge);
  EXPECT_EQ(cache.Find(Key(19999)), Ids(1, 19999));  // the most recent is kept
  EXPECT_EQ(cache.Find(Key(0)), std::nullopt);       // the oldest went
  cache.Insert(Key(19999), Ids(3, 0));               // a replaced entry is charged once
  EXPECT_EQ(cache.charged(), cache.tokens() + cache.entries() * (kCharge - 1));
  DocumentTokenCache small(DocumentTokenCache::kEntryOverheadTokens + 10);
  small.Insert(Key(1), Ids(11, 0));  // its ids and overhead exceed the budget: not cached
  EXPECT_EQ(small.entries(), 0);
  small.Insert(Key(1), Ids(10, 0));
  EXPECT_EQ(small.entries(), 1);
}

TEST(DocumentTokenCacheTest, ConcurrentUseKeepsTheBudget) {
  DocumentTokenCache cache(1000, /*entry_overhead_tokens=*/0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&cache, t] {
      for (int i = 0; i < 2000; ++i) {
        const uint64_t k = (t * 7919 + i) % 97;
        if (auto found = cache.Find(Key(k))) {
          ASSERT_EQ(*found, Ids(static_cast<int>(k % 40) + 1, static_cast<int32_t>(k)));
        } else {
          cache.Insert(Key(k), Ids(static_cast<int>(k % 40) + 1, static_cast<int32_t>(k)));
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  // 97 keys of ~20 ids each overflow the budget: inserts and evictions raced with lookups.
  EXPECT_LE(cache.tokens(), 1000);
  EXPECT_EQ(cache.hits() + cache.misses(), 8 * 2000);
  int64_t held = 0;
  for (uint64_t k = 0; k < 97; ++k) {
    if (auto found = cache.Find(Key(k))) held += static_cast<int64_t>(found->size());
  }
  EXPECT_EQ(held, cache.tokens());
}

// Through PrepareRequest: a text document seen before is not tokenized again and gets the same
// ids; token-id documents never touch the cache.
TEST(DocumentTokenCacheTest, PrepareRequestReusesIdsOfTextSeenBefore) {
  auto tokenizer = MakeByteTokenizer();
  const ModelConfig config = TinyTestConfig();
  const ModelIdentity identity{"model", TokenizerFingerprint(*tokenizer)};
  DocumentTokenCache cache(1 << 20);
  EngineRequest r;
  r.documents.push_back({.text = "the first document"});
  r.documents.push_back({.token_ids = std::vector<int32_t>{5, 6, 7}});
  r.question = "why?";
  auto first = PrepareRequest(r, *tokenizer, config, identity, {}, {.token_ids = &cache});
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(cache.entries(), 1);
  EXPECT_EQ(cache.misses(), 1);
  auto second = PrepareRequest(r, *tokenizer, config, identity, {}, {.token_ids = &cache});
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(cache.hits(), 1);
  EXPECT_EQ(second->documents[0].tokens, tokenizer->Encode("the first document", false));
  EXPECT_EQ(second->documents[0].tokens, first->documents[0].tokens);
  EXPECT_EQ(second->documents[0].key, first->documents[0].key);
  EXPECT_EQ(second->documents[1].tokens, (std::vector<int32_t>{5, 6, 7}));
  // Another text is another key.
  r.documents[0].text = "the first document!";
  auto third = PrepareRequest(r, *tokenizer, config, identity, {}, {.token_ids = &cache});
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_EQ(cache.hits(), 1);
  EXPECT_EQ(third->documents[0].tokens, tokenizer->Encode("the first document!", false));
}

TEST(DocumentTokenCacheTest, EngineAnswersAlikeFromCachedIds) {
  auto weights = MakeRandomWeights(TinyTestConfig(), 5);
  auto tokenizer = MakeByteTokenizer();
  Engine engine(weights.get(), tokenizer.get(), {.num_kv_blocks = 200});
  EngineRequest r;
  r.documents.push_back({.text = "a document about rivers"});
  r.documents.push_back({.text = "a document about bridges"});
  r.question = "which?";
  r.sampling = {.max_tokens = 6, .ignore_eos = true};
  auto a = engine.Run(r);
  auto b = engine.Run(r);
  ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
  EXPECT_EQ(a->token_ids, b->token_ids);
  EXPECT_EQ(engine.token_cache().hits(), 2);
  EXPECT_EQ(engine.token_cache().entries(), 2);
  EXPECT_EQ(b->usage.document_cached_tokens, b->usage.document_tokens);  // the KV was reused too
}

}  // namespace
}  // namespace lazyattn
