#include "services/worker/engine/cpu_runner.h"

#include <algorithm>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "services/worker/model/random_weights.h"

namespace lazyattn {
namespace {

// Runs `tokens` through the runner in chunks of `chunk` tokens (one chunk per step), with the
// sequence's blocks drawn from `kv` in the order `kv` hands them out, and returns the logits of
// every token.
std::vector<float> RunInChunks(CpuRunner& runner, KvCacheCpu& kv, const std::vector<int32_t>& tokens,
                               int chunk) {
  const int B = kv.shape().block_size;
  std::vector<KvBlockEntry> table;
  std::vector<uint32_t> blocks;
  std::vector<float> all;
  for (size_t start = 0; start < tokens.size(); start += chunk) {
    const size_t n = std::min<size_t>(chunk, tokens.size() - start);
    std::vector<int64_t> slots;
    for (size_t t = start; t < start + n; ++t) {
      if (t % B == 0) blocks.push_back(*kv.Allocate());
      slots.push_back(int64_t{blocks[t / B]} * B + t % B);
    }
    table.clear();
    const size_t total = start + n;
    for (size_t b = 0; b < blocks.size(); ++b) {
      table.push_back(PackKvBlockEntry(blocks[b], 0, std::min<size_t>(B, total - b * B)));
    }
    ForwardChunk ch{.tokens = std::span(tokens).subspan(start, n),
                    .local_start = static_cast<int64_t>(start),
                    .kv_slots = slots,
                    .block_table = table,
                    .first_query_index = static_cast<int64_t>(start),
                    .logits_for_all_tokens = true};
    auto logits = runner.Forward(std::span(&ch, 1), kv);
    EXPECT_TRUE(logits.ok()) << logits.status();
    all.insert(all.end(), logits->begin(), logits->end());
  }
  return all;
}

class CpuRunnerTest : public ::testing::Test {
 protected:
  CpuRunnerTest() : weights_(MakeRandomWeights(TinyTestConfig(), 11)), runner_(weights_.get()) {
    std::mt19937 rng(5);
    for (int i = 0; i < 45; ++i) tokens_.push_back(static_cast<int32_t>(rng() % 300));
  }
  std::unique_ptr<ModelWeights> weights_;
  CpuRunner runner_;
  std::vector<int32_t> tokens_;
};

TEST_F(CpuRunnerTest, ChunkedPrefillAndDecodeMatchOneShotPrefill) {
  // f32 pools: chunking changes the keys' fp32 summation order, and an F16 pool can turn such a
  // 1e-7 difference into a half's rounding step (2^-11), which would hide what this checks.
  const auto f32 = KvCacheDtype::kF32;
  KvCacheCpu kv1(runner_.config(), 8, kDefaultKvBlockSize, f32),
      kv2(runner_.config(), 8, kDefaultKvBlockSize, f32),
      kv3(runner_.config(), 8, kDefaultKvBlockSize, f32);
  const auto one_shot = RunInChunks(runner_, kv1, tokens_, 45);
  const auto chunked = RunInChunks(runner_, kv2, tokens_, 7);
  const auto decode = RunInChunks(runner_, kv3, tokens_, 1);
  ASSERT_EQ(one_shot.size(), 45u * 300);
  for (size_t i = 0; i < one_shot.size(); ++i) {
    ASSERT_NEAR(chunked[i], one_shot[i], 1e-4) << i;
    ASSERT_NEAR(decode[i], one_shot[i], 1e-4) << i;
  }
}

TEST_F(CpuRunnerTest, PhysicalBlockPlacementDoesNotMatter) {
  KvCacheCpu in_order(runner_.config(), 8), scattered(runner_.config(), 16);
  // Take some blocks away first so the sequence lands on other, non-contiguous ids.
  std::vector<uint32_t> taken;
  for (int i = 0; i < 7; ++i) taken.push_back(*scattered.Allocate());
  scattered.Free(taken[2]);
  scattered.Free(taken[5]);
  const auto a = RunInChunks(runner_, in_order, tokens_, 16);
  const auto b = RunInChunks(runner_, scattered, tokens_, 16);
  for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], 1e-5) << i;
}

TEST_F(CpuRunnerTest, BatchedChunksEqualSeparateRuns) {
  // Two sequences in one step give the logits each gives alone.
  KvCacheCpu kv(runner_.config(), 16), alone_kv(runner_.config(), 16);
  const std::vector<int32_t> a(tokens_.begin(), tokens_.begin() + 20),
      b(tokens_.begin() + 20, tokens_.end());
  const auto la = RunInChunks(runner_, alone_kv, a, 20);
  const auto lb = RunInChunks(runner_, alone_kv, b, 25);
  std::vector<int64_t> sa, sb;
  for (int t = 0; t < 20; ++t) sa.push_back(0 * 16 + t);  // blocks 0, 1
  for (int t = 0; t < 25; ++t) sb.push_back(int64_t{2 + t / 16} * 16 + t % 16);  // blocks 2, 3
  const std::vector<KvBlockEntry> ta = {PackKvBlockEntry(0, 0, 16), PackKvBlockEntry(1, 0, 4)};
  const std::vector<KvBlockEntry> tb = {PackKvBlockEntry(2, 0, 16), PackKvBlockEntry(3, 0, 9)};
  const ForwardChunk chunks[] = {
      {.tokens = a, .kv_slots = sa, .block_table = ta, .logits_for_all_tokens = true},
      {.tokens = b, .kv_slots = sb, .block_table = tb, .logits_for_all_tokens = false}};
  auto both = runner_.Forward(chunks, kv);
  ASSERT_TRUE(both.ok()) << both.status();
  ASSERT_EQ(both->size(), (20u + 1u) * 300);
  // Equal up to fp32 summation order: OpenBLAS picks its kernels by the rows of a product, and
  // on AVX-512 machines (its SkylakeX kernels) 45 rows and 20 rows sum differently (measured
  // 1.2e-4 on logits of ~0.2; within 1e-4 with its Haswell kernels).
  constexpr float kTolerance = 5e-4f;
  for (size_t i = 0; i < la.size(); ++i) ASSERT_NEAR((*both)[i], la[i], kTolerance) << i;
  for (size_t i = 0; i < 300; ++i) {
    ASSERT_NEAR((*both)[la.size() + i], lb[24 * 300 + i], kTolerance) << i;
  }
}

TEST_F(CpuRunnerTest, RejectsBadChunksWithClearErrors) {
  KvCacheCpu kv(runner_.config(), 4);
  const std::vector<int32_t> bad_token = {1, 300};
  const std::vector<int64_t> slots = {0, 1};
  const std::vector<KvBlockEntry> table = {PackKvBlockEntry(0, 0, 2)};
  ForwardChunk ch{.tokens = bad_token, .kv_slots = slots, .block_table = table};
  auto r = runner_.Forward(std::span(&ch, 1), kv);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("token id 300"), std::string::npos) << r.status();

  const std::vector<int32_t> ok_tokens = {1, 2};
  const std::vector<KvBlockEntry> short_table = {PackKvBlockEntry(0, 0, 1)};
  ch = {.tokens = ok_tokens, .kv_slots = slots, .block_table = short_table};
  EXPECT_EQ(runner_.Forward(std::span(&ch, 1), kv).status().code(),
            absl::StatusCode::kInvalidArgument);

  ch = {.tokens = ok_tokens, .segment_delta = 4095, .kv_slots = slots, .block_table = table};
  r = runner_.Forward(std::span(&ch, 1), kv);
  EXPECT_NE(r.status().message().find("context"), std::string::npos) << r.status();

  // The penalty counts come from the engine (PenaltyCounts); an entry naming an id past the
  // vocabulary, or a negative count, is refused before a sampler indexes the logits with it.
  SamplingRowParams penalized;
  penalized.presence_penalty = 0.5f;
  for (const PenaltyEntry& bad :
       {PenaltyEntry{.id = 300, .output_count = 1}, PenaltyEntry{.id = 3, .output_count = -1}}) {
    const std::vector<PenaltyEntry> entries = {bad};
    ch = {.tokens = ok_tokens, .kv_slots = slots, .block_table = table};
    ch.sampling = penalized;
    ch.penalties = entries;
    r = runner_.Forward(std::span(&ch, 1), kv);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
    EXPECT_NE(r.status().message().find("penalty entry"), std::string::npos) << r.status();
  }
}

}  // namespace
}  // namespace lazyattn
