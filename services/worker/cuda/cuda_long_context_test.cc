// The CUDA backend at the end of a 128K context, against the CPU backend (fp32, cos/sin computed
// in double: kernels/include/rope.h). A small model of llama3-8b's head size and RoPE (theta
// 500,000, Llama-3 scaling, 131,072 positions) runs a prompt, a document read lazily at its
// offset, a question and a decode step whose positions end at 131,071, the last one the model
// has. An fp32 angle there is off by ~1e-2 radians, so a kernel that computed one would drift
// from the CPU twin; the document encoded at its positions, and block mode's re-rotated copy of
// the lazy blocks there, must agree with the lazy read. Runs on the GPU machine (tests/gpu/run.sh); skips without a GPU.
#include <cstdint>
#include <iostream>
#include <random>
#include <span>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/include/block_copy.h"
#include "kernels/cuda/cuda_test_util.h"
#include "services/worker/cuda/cuda_backend_test_util.h"
#include "services/worker/engine/cpu_runner.h"
#include "services/worker/model/random_weights.h"

namespace lazyattn {
namespace {

// head_dim 128 puts prefill attention on the wgmma kernel (compute capability 9.0), which rotates
// queries by the documents' offsets; decode runs the paged decode kernel.
ModelConfig LongContextConfig() {
  ModelConfig c = *NamedModelShape("llama3-8b");  // its RoPE and 131,072 positions
  c.name = "small-128k";
  c.vocab_size = 1024;
  c.hidden_size = 1024;
  c.intermediate_size = 1408;
  c.num_layers = 2;
  c.num_heads = 8;
  c.num_kv_heads = 2;
  return c;
}

constexpr int kBlock = kDefaultKvBlockSize;

// Table entries for `tokens` tokens in consecutive blocks from `first_block`, read at `delta`.
std::vector<KvBlockEntry> Entries(int first_block, int tokens, uint32_t delta) {
  std::vector<KvBlockEntry> e;
  for (int t = 0; t < tokens; t += kBlock) {
    e.push_back(PackKvBlockEntry(first_block + t / kBlock, delta,
                                 static_cast<uint32_t>(std::min(kBlock, tokens - t))));
  }
  return e;
}

std::vector<int64_t> Slots(int first_block, int from, int n) {
  std::vector<int64_t> s(n);
  for (int i = 0; i < n; ++i) s[i] = int64_t{first_block} * kBlock + from + i;
  return s;
}

std::vector<KvBlockEntry> Concat(std::initializer_list<std::vector<KvBlockEntry>> parts) {
  std::vector<KvBlockEntry> all;
  for (const auto& p : parts) all.insert(all.end(), p.begin(), p.end());
  return all;
}

// Every row of `got` against the same row of `want`, `vocab` logits a row.
void ExpectRowsClose(const std::vector<float>& got, const std::vector<float>& want, int64_t vocab,
                     const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  ASSERT_GT(want.size(), 0u) << what;
  double worst = 0;
  for (size_t row = 0; row * vocab < want.size(); ++row) {
    const LogitsDiff d = CompareLogits(std::span(got).subspan(row * vocab, vocab),
                                       std::span(want).subspan(row * vocab, vocab));
    worst = std::max(worst, d.rel_err);
    EXPECT_GT(d.cosine, 0.999) << what << ", row " << row;
    EXPECT_LT(d.rel_err, 0.1) << what << ", row " << row;
  }
  std::cout << what << ": worst rel_err over " << want.size() / vocab << " rows " << worst << "\n";
}

TEST(CudaLongContextTest, PositionsUpTo131071MatchTheCpuBackendInLazyAndBlockMode) {
  SKIP_WITHOUT_GPU();
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(seed);
  const ModelConfig config = LongContextConfig();
  auto w = HfLikeWeights(config, seed);
  CpuModelRunner cpu(w.get(), 80);
  auto gpu = CudaRunnerFor(*w, 80);
  ASSERT_NE(gpu, nullptr);
  std::mt19937 rng(seed);
  auto tokens = [&](int n) {
    std::vector<int32_t> t(n);
    for (int32_t& x : t) x = static_cast<int32_t>(rng() % config.vocab_size);
    return t;
  };
  // Sequence layout: a 40-token prompt at P0, a 200-token document at P0 + 40, a 9-token
  // question at P0 + 240 and one decode token at P0 + 249 = 131,071.
  constexpr int kPrompt = 40, kDoc = 200, kQuestion = 9;
  constexpr int64_t P0 = 131071 - (kPrompt + kDoc + kQuestion);
  constexpr uint32_t kDocOffset = static_cast<uint32_t>(P0 + kPrompt);
  constexpr int64_t kQuestionAt = P0 + kPrompt + kDoc;
  // Blocks: prompt 0..2, the lazy document 10..22, the document encoded at its offset 40..52, a
  // re-rotated copy of the lazy blocks 60..72 (block mode's copy to a new offset), the question
  // 30 (lazy sequence), 31 (encoded at the offset) and 32 (copied).
  const auto prompt = tokens(kPrompt), doc = tokens(kDoc), question = tokens(kQuestion);
  const auto prompt_slots = Slots(0, 0, kPrompt), doc_slots = Slots(10, 0, kDoc),
             block_doc_slots = Slots(40, 0, kDoc), q_slots = Slots(30, 0, kQuestion),
             block_q_slots = Slots(31, 0, kQuestion);
  const auto prompt_table = Entries(0, kPrompt, 0);
  const auto lazy_doc_encode = Entries(10, kDoc, 0);
  const auto block_doc_table = Entries(40, kDoc, 0);

  // Step 1: the document encoded position-free (lazy) and at its global positions (block), and
  // the prompt at P0.. with logits for every token.
  const ForwardChunk step1[] = {
      {.tokens = doc, .kv_slots = doc_slots, .block_table = lazy_doc_encode, .emit_logits = false},
      {.tokens = doc, .segment_delta = kDocOffset, .k_rotation_base = kDocOffset,
       .kv_slots = block_doc_slots, .block_table = block_doc_table, .emit_logits = false},
      {.tokens = prompt, .segment_delta = P0, .k_rotation_base = P0, .kv_slots = prompt_slots,
       .block_table = prompt_table, .logits_for_all_tokens = true, .return_logits = true}};
  auto cpu1 = cpu.Forward(step1);
  auto gpu1 = gpu->Forward(step1);
  ASSERT_TRUE(cpu1.ok()) << cpu1.status();
  ASSERT_TRUE(gpu1.ok()) << gpu1.status();
  ExpectRowsClose(gpu1->logits, cpu1->logits, config.vocab_size, "prompt at P0..P0+39");

  // Step 2: the question after the document, read lazily (rotated by its offset inside the
  // attention kernel) in one sequence and from the block-mode copy in the other.
  const auto lazy_q_table =
      Concat({prompt_table, Entries(10, kDoc, kDocOffset), Entries(30, kQuestion, 0)});
  const auto block_q_table = Concat({prompt_table, block_doc_table, Entries(31, kQuestion, 0)});
  const int64_t q_index = kPrompt + kDoc;
  const ForwardChunk step2[] = {
      {.tokens = question, .segment_delta = kQuestionAt, .k_rotation_base = kQuestionAt,
       .kv_slots = q_slots, .block_table = lazy_q_table, .first_query_index = q_index,
       .logits_for_all_tokens = true, .return_logits = true},
      {.tokens = question, .segment_delta = kQuestionAt, .k_rotation_base = kQuestionAt,
       .kv_slots = block_q_slots, .block_table = block_q_table, .first_query_index = q_index,
       .logits_for_all_tokens = true, .return_logits = true}};
  auto cpu2 = cpu.Forward(step2);
  auto gpu2 = gpu->Forward(step2);
  ASSERT_TRUE(cpu2.ok()) << cpu2.status();
  ASSERT_TRUE(gpu2.ok()) << gpu2.status();
  ExpectRowsClose(gpu2->logits, cpu2->logits, config.vocab_size, "question at P0+240..");
  const size_t half = gpu2->logits.size() / 2;
  const std::vector<float> gpu_lazy(gpu2->logits.begin(), gpu2->logits.begin() + half);
  const std::vector<float> gpu_block(gpu2->logits.begin() + half, gpu2->logits.end());
  ExpectRowsClose(gpu_lazy, gpu_block, config.vocab_size, "lazy vs block on the GPU");

  // Block mode's reuse at a new offset: the lazy blocks copied and rotated by the document's
  // offset (a delta near 131K in the copy kernel), then read with delta 0 like blocks encoded there.
  std::vector<BlockCopy> copies;
  for (int b = 0; b < (kDoc + kBlock - 1) / kBlock; ++b) {
    copies.push_back({.src = static_cast<uint32_t>(10 + b), .dst = static_cast<uint32_t>(60 + b),
                      .delta = static_cast<int32_t>(kDocOffset)});
  }
  ASSERT_TRUE(cpu.CopyBlocks(copies).ok());
  ASSERT_TRUE(gpu->CopyBlocks(copies).ok());
  const auto copy_q_table = Concat({prompt_table, Entries(60, kDoc, 0), Entries(32, kQuestion, 0)});
  const auto copy_q_slots = Slots(32, 0, kQuestion);
  const ForwardChunk step2b[] = {
      {.tokens = question, .segment_delta = kQuestionAt, .k_rotation_base = kQuestionAt,
       .kv_slots = copy_q_slots, .block_table = copy_q_table, .first_query_index = q_index,
       .logits_for_all_tokens = true, .return_logits = true}};
  auto cpu2b = cpu.Forward(step2b);
  auto gpu2b = gpu->Forward(step2b);
  ASSERT_TRUE(cpu2b.ok()) << cpu2b.status();
  ASSERT_TRUE(gpu2b.ok()) << gpu2b.status();
  ExpectRowsClose(gpu2b->logits, cpu2b->logits, config.vocab_size, "question over the copied blocks");
  ExpectRowsClose(gpu2b->logits, gpu_block, config.vocab_size, "copied vs encoded at the offset");

  // Step 3: one decode token at position 131,071 in each sequence.
  const int32_t next = 7;
  const auto lazy_d_table =
      Concat({prompt_table, Entries(10, kDoc, kDocOffset), Entries(30, kQuestion + 1, 0)});
  const auto block_d_table = Concat({prompt_table, block_doc_table, Entries(31, kQuestion + 1, 0)});
  const auto lazy_d_slot = Slots(30, kQuestion, 1), block_d_slot = Slots(31, kQuestion, 1);
  const ForwardChunk step3[] = {
      {.tokens = std::span(&next, 1), .segment_delta = kQuestionAt, .local_start = kQuestion,
       .k_rotation_base = kQuestionAt, .kv_slots = lazy_d_slot, .block_table = lazy_d_table,
       .first_query_index = q_index + kQuestion, .return_logits = true},
      {.tokens = std::span(&next, 1), .segment_delta = kQuestionAt, .local_start = kQuestion,
       .k_rotation_base = kQuestionAt, .kv_slots = block_d_slot, .block_table = block_d_table,
       .first_query_index = q_index + kQuestion, .return_logits = true}};
  ASSERT_EQ(kQuestionAt + kQuestion, 131071);
  auto cpu3 = cpu.Forward(step3);
  auto gpu3 = gpu->Forward(step3);
  ASSERT_TRUE(cpu3.ok()) << cpu3.status();
  ASSERT_TRUE(gpu3.ok()) << gpu3.status();
  ExpectRowsClose(gpu3->logits, cpu3->logits, config.vocab_size, "decode at 131,071");
  EXPECT_EQ(gpu3->token_ids.size(), 2u);

  // One position further is past the model's context: refused, not wrapped or clamped.
  const auto past_slot = Slots(30, kQuestion + 1, 1);
  const auto past_table =
      Concat({prompt_table, Entries(10, kDoc, kDocOffset), Entries(30, kQuestion + 2, 0)});
  const ForwardChunk past[] = {
      {.tokens = std::span(&next, 1), .segment_delta = kQuestionAt, .local_start = kQuestion + 1,
       .k_rotation_base = kQuestionAt, .kv_slots = past_slot, .block_table = past_table,
       .first_query_index = q_index + kQuestion + 1}};
  EXPECT_FALSE(gpu->Forward(past).ok());
  EXPECT_FALSE(cpu.Forward(past).ok());
}

}  // namespace
}  // namespace lazyattn
