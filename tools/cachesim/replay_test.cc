#include "tools/cachesim/replay.h"

#include "gtest/gtest.h"

namespace lazyattn {
namespace {

// Documents 0 and 1 of 32 tokens (two blocks each), a 16-token system prompt and question.
Trace TwoDocs(std::vector<std::vector<int64_t>> orders) {
  Trace t;
  t.seed = 5;
  t.doc_tokens = {32, 32, 32};
  for (auto& docs : orders)
    t.requests.push_back({.system_tokens = 16, .docs = docs, .question_tokens = 16});
  return t;
}

ReplayStats MustReplay(const Trace& t, CacheMode mode, int64_t blocks = 64) {
  auto s = Replay(t, {.mode = mode, .num_blocks = blocks, .block_size = 16, .check_every = 1});
  EXPECT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->invariant_checks, static_cast<int64_t>(t.requests.size()) + 1);
  return s.value_or(ReplayStats{});
}

TEST(ReplayTest, SwappedOrderOnlyLazyHits) {
  const Trace t = TwoDocs({{0, 1}, {1, 0}});
  const ReplayStats lazy = MustReplay(t, CacheMode::kLazy);
  EXPECT_EQ(lazy.doc_tokens, 128);
  EXPECT_EQ(lazy.hit_refs, 2);
  EXPECT_EQ(lazy.hit_tokens, 64);
  EXPECT_EQ(lazy.copy_refs, 0);

  const ReplayStats block = MustReplay(t, CacheMode::kBlock);
  EXPECT_EQ(block.hit_refs, 0);
  EXPECT_EQ(block.copy_refs, 2) << "both documents are cached at the other offset";
  EXPECT_EQ(block.copy_tokens, 64);
  EXPECT_EQ(block.cached_docs_end, 4);  // each document at two offsets

  const ReplayStats prefix = MustReplay(t, CacheMode::kPrefix);
  EXPECT_EQ(prefix.hit_tokens, 0) << "only the system block matches";
}

TEST(ReplayTest, SameOrderEveryModeHitsEverything) {
  const Trace t = TwoDocs({{0, 1}, {0, 1}});
  for (CacheMode m : {CacheMode::kPrefix, CacheMode::kBlock, CacheMode::kLazy}) {
    const ReplayStats s = MustReplay(t, m);
    EXPECT_EQ(s.hit_tokens, 64) << CacheModeName(m);
    EXPECT_EQ(s.hit_refs, 2) << CacheModeName(m);
    EXPECT_EQ(s.copy_refs, 0) << CacheModeName(m);
  }
}

TEST(ReplayTest, BlockCopiesBecomeHitsAtTheirOwnOffset) {
  const ReplayStats s = MustReplay(TwoDocs({{0, 1}, {1, 0}, {1, 0}}), CacheMode::kBlock);
  EXPECT_EQ(s.copy_refs, 2);
  EXPECT_EQ(s.hit_refs, 2);
}

TEST(ReplayTest, PrefixStopsAtTheFirstDifferentDocument) {
  const ReplayStats s = MustReplay(TwoDocs({{0, 1}, {0, 2}}), CacheMode::kPrefix);
  EXPECT_EQ(s.hit_tokens, 32);
  EXPECT_EQ(s.hit_refs, 1);
}

TEST(ReplayTest, PinnedDocumentsAreNotEvictedAndWhatDoesNotFitIsAMiss) {
  // Four blocks: system (1) + document 0 (2) leave one. Document 1 cannot get its two blocks
  // while the system prompt and document 0 are pinned: a miss, not cached.
  const Trace t = TwoDocs({{0, 1}, {0}});
  const ReplayStats s = MustReplay(t, CacheMode::kLazy, /*blocks=*/4);
  EXPECT_EQ(s.uncached_refs, 1);
  EXPECT_EQ(s.hit_refs, 1) << "document 0 survived request 1";
  EXPECT_GT(s.failed_allocations, 0);
}

TEST(ReplayTest, EvictionUnderPressureKeepsTheInvariant) {
  TraceOptions o;
  o.num_documents = 300;
  o.doc_tokens_min = 20;
  o.doc_tokens_max = 90;
  o.docs_per_request = 4;
  o.num_requests = 600;
  o.zipf_a = 1.1;
  o.system_tokens = 24;
  o.question_tokens = 10;
  auto t = GenerateTrace(o);
  ASSERT_TRUE(t.ok());
  for (CacheMode m : {CacheMode::kPrefix, CacheMode::kBlock, CacheMode::kLazy}) {
    const ReplayStats s = MustReplay(*t, m, /*blocks=*/80);
    EXPECT_GT(s.hit_tokens, 0) << CacheModeName(m);
    if (m != CacheMode::kPrefix) {
      EXPECT_GT(s.evicted_docs, 0) << CacheModeName(m);
    }
  }
  const ReplayStats lazy = MustReplay(*t, CacheMode::kLazy, 80);
  const ReplayStats block = MustReplay(*t, CacheMode::kBlock, 80);
  EXPECT_GT(lazy.hit_tokens, block.hit_tokens);
}

TEST(ReplayTest, WarmupIsLeftOutOfTheCounts) {
  auto s = Replay(TwoDocs({{0, 1}, {1, 0}}),
                  {.mode = CacheMode::kLazy, .num_blocks = 64, .warmup_requests = 1});
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->requests, 1);
  EXPECT_EQ(s->doc_tokens, 64);
  EXPECT_DOUBLE_EQ(s->HitRatio(), 1.0);
}

TEST(ReplayTest, BadOptionsAreErrors) {
  const Trace t = TwoDocs({{0, 1}});
  EXPECT_EQ(Replay(t, {.mode = CacheMode::kFull, .num_blocks = 8}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Replay(t, {.mode = CacheMode::kLazy, .num_blocks = 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace lazyattn
