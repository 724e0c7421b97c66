// Two CUDA runners of one model that must give the same bits: decode replayed from CUDA graphs
// against eager steps, and the wgmma, fused and packed-weight products against cuBLASLt's. Runs on
// the GPU machine (tests/gpu/run.sh); skips without a GPU.
#include <cmath>
#include <random>

#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/cuda/skinny_wgmma_linear.h"
#include "services/worker/cuda/cuda_backend_test_util.h"
#include "services/worker/cuda/cuda_model_runner.h"
#include "services/worker/cuda/cuda_runner_state.h"

namespace lazyattn {
namespace {

// Two runners of the same random SmallConfig weights, one launching eagerly, one replaying
// decode graphs, to compare bit for bit. Without autotuning both use the heuristic's
// algorithms: two independent timings can pick near-tied algorithms with different summation
// orders, and the comparison would then test the tuner, not the graphs.
struct EagerAndGraphed {
  std::unique_ptr<CudaModelRunner> eager, graphed;
};
absl::StatusOr<EagerAndGraphed> EagerAndGraphedRunners(uint32_t seed, int64_t num_kv_blocks) {
  auto w = HfLikeWeights(SmallConfig(), seed);
  auto eager_weights = CudaModelWeights::Upload(*w);
  if (!eager_weights.ok()) return eager_weights.status();
  auto graph_weights = CudaModelWeights::Upload(*w);
  if (!graph_weights.ok()) return graph_weights.status();
  auto eager = CudaModelRunner::Create(
      std::move(*eager_weights),
      {.num_kv_blocks = num_kv_blocks, .cuda_graphs = false, .autotune_gemms = false});
  if (!eager.ok()) return eager.status();
  auto graphed = CudaModelRunner::Create(std::move(*graph_weights),
                                         {.num_kv_blocks = num_kv_blocks, .autotune_gemms = false});
  if (!graphed.ok()) return graphed.status();
  return EagerAndGraphed{std::move(*eager), std::move(*graphed)};
}

// Decode-only steps replayed from CUDA graphs give bit-identical logits to eager launches, as
// the table grows within a width bucket and when it crosses into the next one.
TEST(CudaModelRunnerTest, DecodeGraphsReplayTheEagerResult) {
  SKIP_WITHOUT_GPU();
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(seed);
  auto runners = EagerAndGraphedRunners(seed, 128);
  ASSERT_TRUE(runners.ok()) << runners.status();
  auto& eager = runners->eager;
  auto& graphed = runners->graphed;
  // Two sequences: prompts of 1,000 and 37 tokens, then 40 decode steps of both together (the
  // first crosses from 63 to 65 blocks, a new table-width bucket).
  std::mt19937 rng(seed);
  std::vector<int> lengths = {1000, 37};
  std::vector<std::vector<int32_t>> seqs(2);
  std::vector<uint32_t> first_block = {0, 80};
  auto table_of = [&](int s, int64_t n) {
    std::vector<KvBlockEntry> t;
    for (int64_t b = 0; b * 16 < n; ++b) {
      t.push_back(PackKvBlockEntry(first_block[s] + b, 0,
                                   static_cast<uint32_t>(std::min<int64_t>(16, n - b * 16))));
    }
    return t;
  };
  for (int sidx = 0; sidx < 2; ++sidx) {
    for (int t = 0; t < lengths[sidx]; ++t) seqs[sidx].push_back(rng() % 1024);
    std::vector<int64_t> slots(lengths[sidx]);
    for (int t = 0; t < lengths[sidx]; ++t) slots[t] = first_block[sidx] * 16 + t;
    const auto table = table_of(sidx, lengths[sidx]);
    const ForwardChunk ch{.tokens = seqs[sidx], .kv_slots = slots, .block_table = table};
    ASSERT_TRUE(eager->Forward(std::span(&ch, 1)).ok());
    ASSERT_TRUE(graphed->Forward(std::span(&ch, 1)).ok());
  }
  for (int step = 0; step < 40; ++step) {
    std::vector<int32_t> next(2);
    std::vector<std::vector<int64_t>> slot(2);
    std::vector<std::vector<KvBlockEntry>> tables(2);
    std::vector<ForwardChunk> chunks;
    for (int sidx = 0; sidx < 2; ++sidx) {
      const int64_t pos = static_cast<int64_t>(seqs[sidx].size());
      next[sidx] = static_cast<int32_t>(rng() % 1024);
      seqs[sidx].push_back(next[sidx]);
      slot[sidx] = {first_block[sidx] * 16 + pos};
      tables[sidx] = table_of(sidx, pos + 1);
    }
    for (int sidx = 0; sidx < 2; ++sidx) {
      chunks.push_back({.tokens = std::span(&next[sidx], 1),
                        .local_start = static_cast<int64_t>(seqs[sidx].size()) - 1,
                        .kv_slots = slot[sidx],
                        .block_table = tables[sidx],
                        .first_query_index = static_cast<int64_t>(seqs[sidx].size()) - 1,
                        .sampling = step % 2 == 1 ? SamplingRowParams{.temperature = 0.8f,
                                                                      .top_p = 0.9f,
                                                                      .seed = 5,
                                                                      .step = uint64_t(step)}
                                                  : SamplingRowParams{},
                        .return_logits = step % 2 == 0});
    }
    auto a = eager->Forward(chunks);
    auto b = graphed->Forward(chunks);
    ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
    EXPECT_EQ(a->logits, b->logits) << "step " << step;
    EXPECT_EQ(a->token_ids, b->token_ids) << "step " << step;
  }
  EXPECT_EQ(eager->graph_launches(), 0);
  EXPECT_GE(graphed->graph_captures(), 3);  // 2 buckets x (argmax, sampler)
  EXPECT_GE(graphed->graph_launches(), 30);
}

// A one-token chunk that emits nothing (a document's last token, encoded alone) passes for a
// decode row, so "4 decoders + that chunk" has the batch of "5 decoders" but one sampling row
// fewer: each must replay its own graph, or the LM head and the samplers run over the wrong rows
// and the step reads its metadata at the other's offsets (5 rows' logit indices end 16 bytes
// later than 4 rows').
TEST(CudaModelRunnerTest, DecodeGraphsKeepStepsThatSampleFewerRowsApart) {
  SKIP_WITHOUT_GPU();
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(seed);
  auto runners = EagerAndGraphedRunners(seed, 64);
  ASSERT_TRUE(runners.ok()) << runners.status();
  auto& eager = runners->eager;
  auto& graphed = runners->graphed;
  // Sequence i owns blocks [8 i, 8 i + 8); prompts of 20 tokens.
  constexpr int kSeqs = 5;
  std::mt19937 rng(seed);
  std::vector<std::vector<int32_t>> seqs(kSeqs);
  auto table_of = [](int s, int64_t n) {
    std::vector<KvBlockEntry> t;
    for (int64_t b = 0; b * 16 < n; ++b) {
      t.push_back(PackKvBlockEntry(static_cast<uint32_t>(8 * s + b), 0,
                                   static_cast<uint32_t>(std::min<int64_t>(16, n - b * 16))));
    }
    return t;
  };
  for (int s = 0; s < kSeqs; ++s) {
    for (int t = 0; t < 20; ++t) seqs[s].push_back(static_cast<int32_t>(rng() % 1024));
    std::vector<int64_t> slots(20);
    for (int t = 0; t < 20; ++t) slots[t] = 8 * 16 * s + t;
    const auto table = table_of(s, 20);
    const ForwardChunk ch{.tokens = seqs[s], .kv_slots = slots, .block_table = table};
    ASSERT_TRUE(eager->Forward(std::span(&ch, 1)).ok());
    ASSERT_TRUE(graphed->Forward(std::span(&ch, 1)).ok());
  }
  // Steps alternate: all 5 rows sample, then the last row's chunk emits nothing; each shape three
  // times. A shape's graph is captured the second time it is seen, replayed the third.
  for (int step = 0; step < 6; ++step) {
    const bool last_silent = step % 2 == 1;
    std::vector<int32_t> next(kSeqs);
    std::vector<std::vector<int64_t>> slot(kSeqs);
    std::vector<std::vector<KvBlockEntry>> tables(kSeqs);
    std::vector<ForwardChunk> chunks;
    for (int s = 0; s < kSeqs; ++s) {
      const int64_t pos = static_cast<int64_t>(seqs[s].size());
      next[s] = static_cast<int32_t>(rng() % 1024);
      seqs[s].push_back(next[s]);
      slot[s] = {8 * 16 * s + pos};
      tables[s] = table_of(s, pos + 1);
    }
    for (int s = 0; s < kSeqs; ++s) {
      const int64_t pos = static_cast<int64_t>(seqs[s].size()) - 1;
      chunks.push_back({.tokens = std::span(&next[s], 1),
                        .local_start = pos,
                        .kv_slots = slot[s],
                        .block_table = tables[s],
                        .first_query_index = pos,
                        .emit_logits = !(last_silent && s == kSeqs - 1),
                        .return_logits = true});
    }
    auto a = eager->Forward(chunks);
    auto b = graphed->Forward(chunks);
    ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
    ASSERT_EQ(a->token_ids.size(), size_t(last_silent ? kSeqs - 1 : kSeqs)) << "step " << step;
    EXPECT_EQ(a->token_ids, b->token_ids) << "step " << step;
    EXPECT_EQ(a->logits, b->logits) << "step " << step;
  }
  EXPECT_EQ(graphed->graph_captures(), 2);  // one graph a shape
  EXPECT_EQ(graphed->graph_launches(), 4);
}

// A step whose buffers fail to grow part-way (the card out of memory) has already freed what it
// grew, or began to grow: every decode graph captured before it holds dangling pointers. Whichever
// allocation fails, the next decode step must not replay one (it runs eagerly, as a shape seen
// for the first time) and must give the eager runner's bits. The failing step prefills a
// 700-token prompt: more rows than any step before (the row buffers grow) and a split KV (the
// prefill workspace grows last). Dropping graphs only after every Reserve succeeded left them in
// place when the workspace failed, and a decode step, which reserves no workspace, replayed one.
TEST(CudaModelRunnerTest, AStepWhoseBuffersFailToGrowLeavesNoStaleDecodeGraph) {
  SKIP_WITHOUT_GPU();
  using cuda_runner_internal::Buffer;
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(seed);
  auto w = HfLikeWeights(SmallConfig(), seed);
  auto runner = [&](bool graphs) {
    auto gpu = CudaModelWeights::Upload(*w);
    EXPECT_TRUE(gpu.ok()) << gpu.status();
    auto r = CudaModelRunner::Create(
        std::move(*gpu), {.num_kv_blocks = 64, .cuda_graphs = graphs, .autotune_gemms = false});
    EXPECT_TRUE(r.ok()) << r.status();
    return std::move(*r);
  };
  std::mt19937 rng(seed);
  // Sequence 0 (blocks 0-3): a 30-token prompt, then 6 decode steps; sequence 1 (blocks 8-51):
  // the 700-token prompt of the failing step.
  std::vector<int32_t> prompt(30), decoded(6), long_prompt(700);
  for (int32_t& t : prompt) t = static_cast<int32_t>(rng() % 1024);
  for (int32_t& t : decoded) t = static_cast<int32_t>(rng() % 1024);
  for (int32_t& t : long_prompt) t = static_cast<int32_t>(rng() % 1024);
  auto table = [](uint32_t first_block, int64_t n) {
    std::vector<KvBlockEntry> t;
    for (int64_t b = 0; b * 16 < n; ++b) {
      t.push_back(PackKvBlockEntry(first_block + static_cast<uint32_t>(b), 0,
                                   static_cast<uint32_t>(std::min<int64_t>(16, n - b * 16))));
    }
    return t;
  };
  auto prefill = [&](CudaModelRunner& r, std::span<const int32_t> tokens, uint32_t first_block) {
    std::vector<int64_t> slots(tokens.size());
    for (size_t t = 0; t < tokens.size(); ++t) slots[t] = int64_t{first_block} * 16 + int64_t(t);
    const auto blocks = table(first_block, static_cast<int64_t>(tokens.size()));
    const ForwardChunk ch{.tokens = tokens, .kv_slots = slots, .block_table = blocks};
    return r.Forward(std::span(&ch, 1));
  };
  auto decode = [&](CudaModelRunner& r, int step) {
    const int64_t pos = 30 + step;
    const std::vector<int64_t> slot = {pos};
    const auto blocks = table(0, pos + 1);
    const ForwardChunk ch{.tokens = std::span(&decoded[step], 1),
                          .local_start = pos,
                          .kv_slots = slot,
                          .block_table = blocks,
                          .first_query_index = pos,
                          .return_logits = true};
    return r.Forward(std::span(&ch, 1));
  };
  auto eager = runner(false);
  ASSERT_TRUE(prefill(*eager, prompt, 0).ok());
  std::vector<ForwardOutput> want;
  for (int step = 0; step < 6; ++step) {
    auto out = decode(*eager, step);
    ASSERT_TRUE(out.ok()) << out.status();
    want.push_back(*std::move(out));
  }
  int failures = 0;
  for (int64_t n = 1;; ++n) {
    SCOPED_TRACE(::testing::Message() << "allocation " << n << " of the long prefill fails");
    auto graphed = runner(true);
    ASSERT_TRUE(prefill(*graphed, prompt, 0).ok());
    for (int step = 0; step < 3; ++step) {  // captured at step 1, replayed at step 2
      auto out = decode(*graphed, step);
      ASSERT_TRUE(out.ok()) << out.status();
      EXPECT_EQ(out->logits, want[step].logits) << "step " << step;
    }
    ASSERT_EQ(graphed->graph_launches(), 2);
    Buffer::FailAllocationForTest(n);
    const absl::Status failed = prefill(*graphed, long_prompt, 8).status();
    Buffer::FailAllocationForTest(0);
    const int64_t launches_before = graphed->graph_launches();
    for (int step = 3; step < 6; ++step) {
      auto out = decode(*graphed, step);
      ASSERT_TRUE(out.ok()) << out.status();
      EXPECT_EQ(out->logits, want[step].logits) << "step " << step;
      EXPECT_EQ(out->token_ids, want[step].token_ids) << "step " << step;
      if (step == 3 && !failed.ok()) {
        EXPECT_EQ(graphed->graph_launches(), launches_before) << "a graph from before replayed";
      }
    }
    if (failed.ok()) break;  // fewer than n allocations: every one has failed once
    EXPECT_EQ(failed.code(), absl::StatusCode::kResourceExhausted) << failed;
    ++failures;
  }
  // The 8 row buffers, the prefill workspace, and the table store where it grows.
  EXPECT_GE(failures, 9);
}

// Runs the same steps on runners built with options `a` and `b` from the same weights and
// expects the same logits up to rounding: rel_err (the file's metric, `a` as reference) <=
// max_rel_err and cosine > 0.999. Steps: a 40-token prompt, then decode batches of 2 and 64
// (graphs replay the second time on); sequence i is a lazy-mode segment at global offset
// 37 i + 5, so queries are rotated to offsets and keys by their table's delta.
void ExpectSameLogits(const ModelConfig& config, CudaRunnerOptions a, CudaRunnerOptions b,
                      double max_rel_err, std::vector<std::unique_ptr<CudaModelRunner>>* out) {
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(seed);
  auto w = HfLikeWeights(config, seed);
  std::vector<std::unique_ptr<CudaModelRunner>> runners;
  for (CudaRunnerOptions options : {a, b}) {
    auto gpu = CudaModelWeights::Upload(*w);
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    options.num_kv_blocks = 512;
    auto r = CudaModelRunner::Create(std::move(*gpu), options);
    ASSERT_TRUE(r.ok()) << r.status();
    runners.push_back(std::move(*r));
  }
  const int64_t vocab = config.vocab_size;
  std::mt19937 rng(seed);
  // Sequence i owns blocks [8 i, 8 i + 8): up to 128 tokens.
  std::vector<std::vector<int32_t>> seqs(64);
  auto step = [&](int num_seqs, int64_t new_tokens) {
    std::vector<std::vector<int64_t>> slots(num_seqs);
    std::vector<std::vector<KvBlockEntry>> tables(num_seqs);
    std::vector<ForwardChunk> chunks;
    for (int i = 0; i < num_seqs; ++i) {
      const int64_t start = static_cast<int64_t>(seqs[i].size());
      for (int64_t t = 0; t < new_tokens; ++t) {
        seqs[i].push_back(static_cast<int32_t>(rng() % 1024));
      }
      for (int64_t t = start; t < start + new_tokens; ++t) slots[i].push_back(8 * 16 * i + t);
      const int64_t offset = 37 * i + 5;
      for (int64_t b = 0; b * 16 < start + new_tokens; ++b) {
        tables[i].push_back(PackKvBlockEntry(
            static_cast<uint32_t>(8 * i + b), static_cast<uint32_t>(offset),
            static_cast<uint32_t>(std::min<int64_t>(16, start + new_tokens - b * 16))));
      }
      chunks.push_back({.tokens = std::span(seqs[i]).subspan(start),
                        .segment_delta = offset,
                        .local_start = start,
                        .kv_slots = slots[i],
                        .block_table = tables[i],
                        .first_query_index = start,
                        .return_logits = true});
    }
    auto ra = runners[0]->Forward(chunks);
    auto rb = runners[1]->Forward(chunks);
    ASSERT_TRUE(ra.ok() && rb.ok()) << ra.status() << rb.status();
    ASSERT_EQ(ra->logits.size(), size_t(num_seqs) * vocab);
    ASSERT_EQ(rb->logits.size(), ra->logits.size());
    for (int i = 0; i < num_seqs; ++i) {
      const auto d = CompareLogits(std::span(rb->logits).subspan(i * vocab, vocab),
                                   std::span(ra->logits).subspan(i * vocab, vocab));
      EXPECT_LE(d.rel_err, max_rel_err) << "sequence " << i << " of " << num_seqs;
      EXPECT_GT(d.cosine, 0.999) << "sequence " << i << " of " << num_seqs;
    }
  };
  step(1, 40);
  for (int i = 0; i < 3; ++i) step(2, 1);
  for (int i = 0; i < 3; ++i) step(64, 1);
  EXPECT_GE(runners[1]->graph_launches(), 2);
  *out = std::move(runners);
}

bool HasWgmma() { return SkinnyWgmmaLinearSupports(1, 64, 1, nullptr, nullptr, nullptr); }

// Steps of 2 to 64 rows on the wgmma few-row kernel (CudaRunnerOptions::wgmma_max_rows) against
// cuBLASLt: the fp32 sums run in another order, so bf16 roundings of the products may move.
// Bound: rel_err 0.05, half the one this file sets for bf16 against fp32.
TEST(CudaModelRunnerTest, WgmmaGemmsMatchCublasLt) {
  SKIP_WITHOUT_GPU();
  if (!HasWgmma()) GTEST_SKIP() << "needs a compute capability 9.0 device";
  std::vector<std::unique_ptr<CudaModelRunner>> runners;
  ExpectSameLogits(SmallConfig(), {.wgmma_max_rows = 0}, {.wgmma_max_rows = 64}, 0.05, &runners);
}

// RoPE and the K/V append in the wgmma QKV product (CudaRunnerOptions::fused_qkv_rope) against
// RopeKvAppend's launch, on a head_dim-128 model: the same bf16 values rotated the same way; the
// fused product is cut in 128-feature tiles, and so is the plain one here (left to choose, it
// took other cuts, summed in another order, and one seed measured rel_err 0.0204), so only the
// rotation's rounding may differ: rel_err <= 0.02.
TEST(CudaModelRunnerTest, FusedQkvRopeMatchesRopeKvAppend) {
  SKIP_WITHOUT_GPU();
  if (!HasWgmma()) GTEST_SKIP() << "needs a compute capability 9.0 device";
  ModelConfig c = SmallConfig();
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 128;
  c.rope.head_dim = 128;
  std::vector<std::unique_ptr<CudaModelRunner>> runners;
  const CudaRunnerOptions::WgmmaCuts cuts{.qkv = {.tile_features = 128}};
  ExpectSameLogits(c, {.wgmma_max_rows = 64, .wgmma_cuts = cuts},
                   {.wgmma_max_rows = 64, .fused_qkv_rope = true, .wgmma_cuts = cuts}, 0.02,
                   &runners);
  ASSERT_EQ(runners.size(), 2u);
  EXPECT_EQ(runners[0]->fused_qkv_rope_launches(), 0);
  // Every layer of every eager or captured step (the prompt step at least) took the fused path.
  EXPECT_GE(runners[1]->fused_qkv_rope_launches(), c.num_layers);
  EXPECT_EQ(runners[1]->fused_qkv_rope_launches() % c.num_layers, 0);
}

// The wgmma kernel reading packed weights (CudaRunnerOptions::wgmma_packed_weights) computes
// the same sums from the same values: logits equal bit for bit (rel_err 0), on the plain and
// gate/up forms (small model) and the QKV + RoPE form (head_dim 128).
TEST(CudaModelRunnerTest, WgmmaPackedWeightsGiveTheSameLogits) {
  SKIP_WITHOUT_GPU();
  if (!HasWgmma()) GTEST_SKIP() << "needs a compute capability 9.0 device";
  std::vector<std::unique_ptr<CudaModelRunner>> runners;
  ExpectSameLogits(SmallConfig(), {.wgmma_max_rows = 64, .wgmma_packed_weights = false},
                   {.wgmma_max_rows = 64, .wgmma_packed_weights = true}, 0.0, &runners);
  ASSERT_EQ(runners.size(), 2u);
  EXPECT_EQ(runners[0]->packed_weight_bytes(), 0);
  EXPECT_GT(runners[1]->packed_weight_bytes(), 0);  // the packed path ran
  ModelConfig c = SmallConfig();
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 128;
  c.rope.head_dim = 128;
  ExpectSameLogits(c, {.wgmma_max_rows = 64, .fused_qkv_rope = true, .wgmma_packed_weights = false},
                   {.wgmma_max_rows = 64, .fused_qkv_rope = true, .wgmma_packed_weights = true},
                   0.0, &runners);
  ASSERT_EQ(runners.size(), 2u);
  EXPECT_GT(runners[1]->packed_weight_bytes(), 0);
  EXPECT_GE(runners[1]->fused_qkv_rope_launches(), c.num_layers);
}

}  // namespace
}  // namespace lazyattn
