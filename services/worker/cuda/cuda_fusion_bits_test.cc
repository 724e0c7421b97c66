// Fusions of the CUDA step that must not change a bit: the RMSNorms inside the one-row products
// (CudaRunnerOptions::fused_norms) and the residual adds inside the cuBLASLt products of prefill
// steps (CudaRunnerOptions::residual_in_products). Each test runs the same chunks on two runners
// over uploads of the same weights, the fusion off in one, and expects equal logits and tokens.
// Runs on the GPU machine (tests/gpu/run.sh); skips without a GPU.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <span>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"
#include "services/worker/cuda/cuda_backend_test_util.h"
#include "services/worker/cuda/cuda_model_runner.h"
#include "services/worker/cuda/cuda_model_weights.h"

namespace lazyattn {
namespace {

// One sequence grown chunk by chunk on two runners: the first built with `off`, the second with
// `on`. No autotuning in either: the multi-row steps run cuBLASLt in both, and two independent
// timings may pick near-tied algorithms that sum in different orders.
class TwinRunners {
 public:
  TwinRunners(uint32_t seed, CudaRunnerOptions off, CudaRunnerOptions on) : rng_(seed) {
    auto w = HfLikeWeights(SmallConfig(), seed);
    for (CudaRunnerOptions options : {off, on}) {
      auto gpu = CudaModelWeights::Upload(*w);
      EXPECT_TRUE(gpu.ok()) << gpu.status();
      if (!gpu.ok()) return;
      options.num_kv_blocks = 64;
      options.autotune_gemms = false;
      auto r = CudaModelRunner::Create(std::move(*gpu), options);
      EXPECT_TRUE(r.ok()) << r.status();
      if (!r.ok()) return;
      runners_.push_back(std::move(*r));
    }
  }

  bool ready() const { return runners_.size() == 2; }
  CudaModelRunner& off() { return *runners_[0]; }
  CudaModelRunner& on() { return *runners_[1]; }

  // Appends `new_tokens` random tokens as one chunk and runs it on both runners. Greedy steps
  // compare the sampled ids only (and replay decode graphs); the others compare the logits.
  void Step(int64_t new_tokens, bool greedy) {
    const int64_t start = static_cast<int64_t>(seq_.size());
    for (int64_t t = 0; t < new_tokens; ++t) seq_.push_back(static_cast<int32_t>(rng_() % 1024));
    std::vector<int64_t> slots;
    for (int64_t t = start; t < start + new_tokens; ++t) slots.push_back(t);
    std::vector<KvBlockEntry> table;
    for (int64_t b = 0; b * 16 < start + new_tokens; ++b) {
      table.push_back(PackKvBlockEntry(
          static_cast<uint32_t>(b), 0,
          static_cast<uint32_t>(std::min<int64_t>(16, start + new_tokens - b * 16))));
    }
    const ForwardChunk ch{.tokens = std::span(seq_).subspan(start),
                          .local_start = start,
                          .kv_slots = slots,
                          .block_table = table,
                          .first_query_index = start,
                          .return_logits = !greedy};
    auto a = runners_[0]->Forward(std::span(&ch, 1));
    auto b = runners_[1]->Forward(std::span(&ch, 1));
    ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
    EXPECT_EQ(a->logits, b->logits) << new_tokens << " tokens at " << start;
    EXPECT_EQ(a->token_ids, b->token_ids) << new_tokens << " tokens at " << start;
    if (!greedy) {  // the comparison is of real logits
      ASSERT_FALSE(a->logits.empty());
      EXPECT_TRUE(std::isfinite(a->logits[0]));
    }
  }

 private:
  std::mt19937 rng_;
  std::vector<int32_t> seq_;
  std::vector<std::unique_ptr<CudaModelRunner>> runners_;
};

// At batch 1 the norms run inside the skinny products and the residual adds inside the o and
// down projections: a prompt's first token alone, then 40 tokens (40 rows: unfused in both),
// then decode steps replayed from graphs.
TEST(CudaFusionBitsTest, FusedNormsAtBatchOneAreBitIdentical) {
  SKIP_WITHOUT_GPU();
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(seed);
  TwinRunners twins(seed, {.fused_norms = false}, {.fused_norms = true});
  ASSERT_TRUE(twins.ready());
  twins.Step(1, false);
  twins.Step(40, false);
  for (int i = 0; i < 30; ++i) twins.Step(1, i % 3 == 0);  // decode, replayed from graphs
  EXPECT_GE(twins.on().graph_launches(), 20);
}

// Prefill chunks past the wgmma kernel's rows (and, with wgmma_max_rows 0, every multi-row
// step) add the o and down products into the residual inside cuBLASLt (beta = 1) instead of
// through a delta the next norm adds: the same fp32 sum, so the same bits, at chunk sizes on
// both sides of the wgmma limit and in the decode steps after them.
TEST(CudaFusionBitsTest, ResidualInPrefillProductsIsBitIdentical) {
  SKIP_WITHOUT_GPU();
  for (int wgmma_max_rows : {CudaRunnerOptions{}.wgmma_max_rows, 0}) {
    const uint32_t seed = testing::FreshSeed();
    SCOPED_TRACE(::testing::Message() << "seed " << seed << ", wgmma_max_rows " << wgmma_max_rows);
    TwinRunners twins(seed, {.residual_in_products = false, .wgmma_max_rows = wgmma_max_rows},
                      {.residual_in_products = true, .wgmma_max_rows = wgmma_max_rows});
    ASSERT_TRUE(twins.ready());
    twins.Step(300, false);
    twins.Step(40, false);
    twins.Step(129, false);
    twins.Step(2, false);
    for (int i = 0; i < 6; ++i) twins.Step(1, i % 2 == 0);
    // The fused path ran: the 300- and 129-row steps, and with wgmma off the 40- and 2-row ones.
    EXPECT_EQ(twins.off().residual_in_product_steps(), 0);
    EXPECT_EQ(twins.on().residual_in_product_steps(), wgmma_max_rows == 0 ? 4 : 2);
  }
}

}  // namespace
}  // namespace lazyattn
