// Mode block's copies of a document cached at another offset: a copy is made from an entry that
// was computed, never from another copy (each copy rounds re-rotated keys once more, so chains of
// copies would drift from the document encoded in place), and never races a job already encoding
// the document at the same offset, and is made only once admission has room for it.
#include <random>

#include "common/monotonic_time.h"
#include "gtest/gtest.h"
#include "services/worker/engine/engine_core.h"
#include "services/worker/engine/request_prep.h"
#include "services/worker/engine/scripted_cpu_runner_for_test.h"
#include "services/worker/model/model_fingerprint.h"
#include "services/worker/model/random_weights.h"
#include "services/worker/model/tokenizer/byte_tokenizer.h"

namespace lazyattn {
namespace {

using testing::ScriptedCpuRunner;

class EngineCoreBlockCopyTest : public ::testing::Test {
 protected:
  void SetUp() override { Init(256); }
  void Init(int64_t blocks) {
    weights_ = MakeRandomWeights(TinyTestConfig(), 3);
    tokenizer_ = MakeByteTokenizer();
    identity_ = {ModelFingerprint(*weights_), TokenizerFingerprint(*tokenizer_)};
    auto runner = std::make_unique<ScriptedCpuRunner>(weights_.get(), blocks);
    runner_ = runner.get();
    core_ = std::make_unique<EngineCore>(std::move(runner), tokenizer_.get(),
                                         EngineOptions{.max_batch_tokens = 64});
  }

  // Document d has kLength[d] tokens (one block each, or several for document 3).
  static constexpr int kLength[] = {24, 40, 72, 200};
  static EngineDocument Doc(int d) {
    std::mt19937 rng(100 + d);
    std::vector<int32_t> tokens(kLength[d]);
    for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % 256);
    return {.id = "doc" + std::to_string(d), .token_ids = std::move(tokens)};
  }
  PreparedRequest Prepare(const std::vector<int>& docs, CacheMode mode, int max_tokens = 2) {
    EngineRequest r;
    r.system_prefix = "Answer from the documents.\n";
    for (int d : docs) r.documents.push_back(Doc(d));
    r.question = "Which one?";
    r.mode = mode;
    r.sampling = {.max_tokens = max_tokens, .ignore_eos = true};
    auto p = PrepareRequest(r, *tokenizer_, weights_->config, identity_, {});
    EXPECT_TRUE(p.ok()) << p.status();
    return *std::move(p);
  }
  // The cache keys of a prepared request's documents, as admission makes them.
  static std::vector<DocCacheKey> Keys(const PreparedRequest& p) {
    std::vector<DocCacheKey> keys;
    PrefillTokensToCompute(p, [&](const DocCacheKey& key, int64_t) {
      keys.push_back(key);
      return false;
    });
    return keys;
  }
  void Add(PreparedRequest p) {
    p.callbacks.on_done = [this](const absl::Status& s, const RequestResult& r) {
      EXPECT_TRUE(s.ok()) << s;
      last_usage_ = r.usage;
      ++done_;
    };
    core_->Add(std::move(p));
  }
  void Drain() {
    for (int guard = 0; core_->HasWork() && guard < 100000; ++guard) core_->Step(MonotonicNow());
    ASSERT_FALSE(core_->HasWork());
    EXPECT_TRUE(core_->cache().CheckInvariant().ok()) << core_->cache().CheckInvariant();
  }
  const ModeCounters& BlockStats() { return core_->stats().mode(CacheMode::kBlock); }

  std::unique_ptr<ModelWeights> weights_;
  std::unique_ptr<Tokenizer> tokenizer_;
  ModelIdentity identity_;
  ScriptedCpuRunner* runner_ = nullptr;
  std::unique_ptr<EngineCore> core_;
  int done_ = 0;
  RequestUsage last_usage_;  // the last request's to end
};

// Document 0 is computed after document 1, then copied to the front (a lower offset), then placed
// after document 2: its second copy comes from the computed entry (delta: 72 - 40 = 32 positions),
// not from the copy at the lower offset (it would be 72 plus what separates the documents).
TEST_F(EngineCoreBlockCopyTest, ACopyIsMadeFromTheComputedEntryNotFromACopy) {
  const PreparedRequest computed = Prepare({1, 0}, CacheMode::kBlock);
  const PreparedRequest copied = Prepare({0}, CacheMode::kBlock);
  const PreparedRequest again = Prepare({2, 0}, CacheMode::kBlock);
  const int64_t computed_at = Keys(computed)[1].offset;
  const int64_t copied_at = Keys(copied)[0].offset;
  const int64_t again_at = Keys(again)[1].offset;
  ASSERT_LT(copied_at, computed_at) << "the copy must sit at the lower offset for this test";
  ASSERT_EQ(again_at - computed_at, kLength[2] - kLength[1]);

  Add(computed);
  Drain();
  ASSERT_TRUE(runner_->copy_deltas.empty());
  Add(copied);
  Drain();
  ASSERT_EQ(BlockStats().doc_copies, 1);
  // Reported as a copy (what the router's copyable claims are checked against), not as a hit.
  EXPECT_EQ(last_usage_.document_copied_tokens, kLength[0]);
  EXPECT_EQ(last_usage_.document_hit_tokens, 0);
  ASSERT_FALSE(runner_->copy_deltas.empty());
  EXPECT_EQ(runner_->copy_deltas.back(), copied_at - computed_at);
  runner_->copy_deltas.clear();
  Add(again);
  Drain();
  EXPECT_EQ(BlockStats().doc_copies, 2);
  ASSERT_FALSE(runner_->copy_deltas.empty());
  for (int32_t delta : runner_->copy_deltas) {
    EXPECT_EQ(delta, again_at - computed_at) << "copied from the copy at " << copied_at;
  }
  EXPECT_EQ(done_, 3);
}

// A block request whose document a job is encoding at the same offset joins that job, even when
// a position-free entry of the document (made meanwhile by a lazy request) could be copied: a
// copy would take the key first and the job's encoding would be thrown away.
TEST_F(EngineCoreBlockCopyTest, ABlockRequestJoinsTheJobEncodingItsDocument) {
  const PreparedRequest lazy = Prepare({3}, CacheMode::kLazy);
  const PreparedRequest block = Prepare({3}, CacheMode::kBlock);
  const DocCacheKey lazy_key = Keys(lazy)[0], block_key = Keys(block)[0];
  Add(lazy);
  Add(block);  // its job starts with the lazy one's; 200 tokens take several 64-token steps each
  for (int guard = 0; guard < 1000 && !core_->cache().documents().Contains(lazy_key); ++guard) {
    core_->Step(MonotonicNow());
  }
  ASSERT_TRUE(core_->cache().documents().Contains(lazy_key));
  ASSERT_FALSE(core_->cache().documents().Contains(block_key))
      << "the block job finished first: nothing left to race";
  Add(Prepare({3}, CacheMode::kBlock));
  Drain();
  EXPECT_EQ(BlockStats().doc_copies, 0);
  EXPECT_TRUE(runner_->copy_deltas.empty());
  EXPECT_EQ(core_->stats().encode_jobs, 2);
  EXPECT_TRUE(core_->cache().documents().Contains(block_key));
  EXPECT_EQ(done_, 3);
}

// A block request refused admission (the pool has no room for it while another request runs,
// though it has for the copy) makes no copy: one would take free blocks that the running request
// was promised, and stay in the cache to be counted a hit, not a copy, when the request is
// admitted.
TEST_F(EngineCoreBlockCopyTest, ARefusedAdmissionMakesNoCopy) {
  Init(/*blocks=*/24);
  Add(Prepare({0}, CacheMode::kBlock));  // document 0 computed right after the prefix
  Drain();
  // A long request takes most of the pool; once it decodes, the next request is refused.
  Add(Prepare({3}, CacheMode::kLazy, /*max_tokens=*/100));
  for (int guard = 0; guard < 100 && core_->Load().waiting + core_->Load().running > 0 &&
                      core_->Load().queued_prefill_tokens > 0;
       ++guard) {
    core_->Step(MonotonicNow());
  }
  const PreparedRequest moved = Prepare({2, 0}, CacheMode::kBlock);
  const DocCacheKey moved_key = Keys(moved)[1];
  Add(moved);
  core_->Step(MonotonicNow());
  ASSERT_EQ(core_->Load().waiting, 1) << "admitted: no refusal to test";
  ASSERT_GE(core_->cache().pool().num_free(), 2) << "no room even for the copy: nothing to test";
  EXPECT_FALSE(core_->cache().documents().Contains(moved_key)) << "copied while refused";
  EXPECT_TRUE(runner_->copy_deltas.empty());
  Drain();
  EXPECT_EQ(BlockStats().doc_copies, 1);
  EXPECT_EQ(BlockStats().doc_hits, 0);
  EXPECT_EQ(done_, 3);
}

}  // namespace
}  // namespace lazyattn
