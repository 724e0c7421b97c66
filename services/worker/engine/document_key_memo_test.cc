// The key memo of token-id documents, alone and behind PrepareRequest.
#include "services/worker/engine/document_key_memo.h"

#include <thread>

#include "gtest/gtest.h"
#include "services/worker/engine/request_prep.h"
#include "services/worker/model/model_fingerprint.h"
#include "services/worker/model/random_weights.h"
#include "services/worker/model/tokenizer/byte_tokenizer.h"

namespace lazyattn {
namespace {

std::vector<int32_t> Ids(int n, int32_t first) {
  std::vector<int32_t> v(n);
  for (int i = 0; i < n; ++i) v[i] = first + i;
  return v;
}

DocumentKey Sha(const std::vector<int32_t>& ids) { return DocumentKeyFromTokens("m", "t", ids); }

// A memo whose compute() is the SHA-256, counting how often it ran. No per-entry overhead unless
// asked, so that the LRU tests count ids alone.
struct CountingMemo {
  explicit CountingMemo(int64_t capacity, int64_t overhead = 0) : memo(capacity, overhead) {}
  DocumentKey KeyOf(const std::vector<int32_t>& ids, const std::vector<int32_t>& scope = {}) {
    return memo.KeyOf(
        ids,
        [&] {
          ++computed;
          return Sha(ids);
        },
        scope);
  }
  DocumentKeyMemo memo;
  int computed = 0;
};

TEST(DocumentKeyMemoTest, RemembersKeysOfRepeatedIdsAndComputesTheRest) {
  CountingMemo m(100);
  const auto a = Ids(10, 0), b = Ids(10, 1);
  EXPECT_EQ(m.KeyOf(a), Sha(a));
  EXPECT_EQ(m.KeyOf(b), Sha(b));
  EXPECT_EQ(m.KeyOf(a), Sha(a));
  EXPECT_EQ(m.KeyOf(b), Sha(b));
  EXPECT_EQ(m.computed, 2);
  EXPECT_EQ(m.memo.hits(), 2);
  EXPECT_EQ(m.memo.misses(), 2);
  EXPECT_EQ(m.memo.tokens(), 20);
}

// Ids one cache scope had hashed are hashed again for another (the time a SHA-256 takes must not
// tell a scope that another sent them); each scope then finds its own.
TEST(DocumentKeyMemoTest, EachCacheScopeHasItsOwnMemory) {
  CountingMemo m(100);
  const auto ids = Ids(10, 0);
  const std::vector<int32_t> a = {1, 2}, b = {1, 3};
  EXPECT_EQ(m.KeyOf(ids, a), Sha(ids));
  EXPECT_EQ(m.KeyOf(ids, b), Sha(ids));
  EXPECT_EQ(m.KeyOf(ids), Sha(ids));
  EXPECT_EQ(m.computed, 3);
  EXPECT_EQ(m.KeyOf(ids, a), Sha(ids));
  EXPECT_EQ(m.KeyOf(ids, b), Sha(ids));
  EXPECT_EQ(m.KeyOf(ids), Sha(ids));
  EXPECT_EQ(m.computed, 3);
}

TEST(DocumentKeyMemoTest, EvictsLeastRecentlyUsedAndSkipsWhatCannotFit) {
  CountingMemo m(25);
  m.KeyOf(Ids(10, 0));
  m.KeyOf(Ids(10, 100));
  m.KeyOf(Ids(10, 0));    // now the most recent
  m.KeyOf(Ids(10, 200));  // 30 > 25: Ids(10, 100) goes
  EXPECT_EQ(m.memo.tokens(), 20);
  m.computed = 0;
  m.KeyOf(Ids(10, 0));
  EXPECT_EQ(m.computed, 0);
  m.KeyOf(Ids(10, 100));
  EXPECT_EQ(m.computed, 1);
  m.computed = 0;
  EXPECT_EQ(m.KeyOf(Ids(30, 0)), Sha(Ids(30, 0)));  // larger than the budget: computed, not kept
  EXPECT_EQ(m.KeyOf(Ids(30, 0)), Sha(Ids(30, 0)));
  EXPECT_EQ(m.computed, 2);
  EXPECT_LE(m.memo.tokens(), 25);
}

// Each entry is charged its bookkeeping besides its ids and scope words: one-token documents in
// distinct scopes (as a client varying its cache salt sends) fill the budget after a few entries
// instead of holding one entry per budgeted id.
TEST(DocumentKeyMemoTest, ManySmallDocumentsAreChargedTheirBookkeeping) {
  constexpr int64_t kCapacity = 1 << 16;
  constexpr int64_t kCharge = 1 + 2 + DocumentKeyMemo::kEntryOverheadTokens;
  CountingMemo m(kCapacity, DocumentKeyMemo::kEntryOverheadTokens);
  for (int i = 0; i < 20000; ++i) m.KeyOf({i}, {7, i});
  EXPECT_EQ(m.memo.entries(), kCapacity / kCharge);
  EXPECT_EQ(m.memo.tokens(), kCapacity / kCharge);
  EXPECT_EQ(m.memo.charged(), m.memo.entries() * kCharge);
  EXPECT_LE(m.memo.charged(), kCapacity);
  m.computed = 0;
  m.KeyOf({19999}, {7, 19999});  // the most recent is remembered
  EXPECT_EQ(m.computed, 0);
  m.KeyOf({0}, {7, 0});  // the oldest went
  EXPECT_EQ(m.computed, 1);
  // A document whose ids and overhead exceed the budget is computed and not kept.
  CountingMemo small(DocumentKeyMemo::kEntryOverheadTokens + 10,
                     DocumentKeyMemo::kEntryOverheadTokens);
  small.KeyOf(Ids(11, 0));
  EXPECT_EQ(small.memo.entries(), 0);
  small.KeyOf(Ids(10, 0));
  EXPECT_EQ(small.memo.entries(), 1);
}

// Ids that differ in one place get their own key even if they were to share a fast hash: the
// memo compares the ids (checked here on many near-identical documents).
TEST(DocumentKeyMemoTest, NearlyEqualDocumentsKeepTheirOwnKeys) {
  DocumentKeyMemo memo(1 << 20);
  std::vector<int32_t> base = Ids(4096, 7);
  for (int i = 0; i < 200; ++i) {
    std::vector<int32_t> ids = base;
    ids[i * 13 % ids.size()] ^= 1;
    EXPECT_EQ(memo.KeyOf(ids, [&] { return Sha(ids); }), Sha(ids)) << i;
    EXPECT_EQ(memo.KeyOf(ids, [&] { return DocumentKey{}; }), Sha(ids)) << i;  // remembered
  }
}

TEST(DocumentKeyMemoTest, ConcurrentUseGivesTheRightKeys) {
  DocumentKeyMemo memo(400, /*entry_overhead_tokens=*/0);
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 500; ++i) {
        const auto ids = Ids(10 + (t * 31 + i) % 50, (t * 31 + i) % 61);
        if (memo.KeyOf(ids, [&] { return Sha(ids); }) != Sha(ids)) ++wrong;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_LE(memo.tokens(), 400);
  EXPECT_EQ(memo.hits() + memo.misses(), 8 * 500);
}

// Through PrepareRequest: a token-id document's key is the SHA-256 of its ids whether it was
// remembered or not.
TEST(DocumentKeyMemoTest, PrepareRequestGivesTheSameKeys) {
  auto tokenizer = MakeByteTokenizer();
  const ModelConfig config = TinyTestConfig();
  const ModelIdentity identity{"model", TokenizerFingerprint(*tokenizer)};
  DocumentKeyMemo memo(1 << 20);
  EngineRequest r;
  r.documents.push_back({.token_ids = Ids(200, 1)});  // ids inside the tiny vocabulary
  r.documents.push_back({.token_ids = Ids(200, 2)});
  r.question = "why?";
  auto plain = PrepareRequest(r, *tokenizer, config, identity, {});
  auto first = PrepareRequest(r, *tokenizer, config, identity, {}, {.keys = &memo});
  auto second = PrepareRequest(r, *tokenizer, config, identity, {}, {.keys = &memo});
  ASSERT_TRUE(plain.ok()) << plain.status();
  ASSERT_TRUE(first.ok() && second.ok());
  for (int d = 0; d < 2; ++d) {
    EXPECT_EQ(first->documents[d].key, plain->documents[d].key);
    EXPECT_EQ(second->documents[d].key, plain->documents[d].key);
  }
  EXPECT_EQ(memo.hits(), 2);
  EXPECT_EQ(memo.misses(), 2);
}

}  // namespace
}  // namespace lazyattn
