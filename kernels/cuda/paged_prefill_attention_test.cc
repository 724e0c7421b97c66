// Paged prefill attention (CUDA) against its CPU twin, PagedAttentionCpu, fed the same
// bf16-rounded inputs: document encodings, requests over documents at large deltas, long
// queries, chunks, plain runs, batches. Fresh random inputs every run (the seed is printed on
// failure), outputs poisoned with NaN before every launch, unused and invalid pool slots NaN (a
// kernel that reads them fails), every element checked (the tolerance:
// paged_prefill_attention_test_util.h).
//
// Every case runs every rotation variant on the mma.sync kernel and, where they apply (head_dim
// 128, kRotateQ or kNone: PrefillWgmmaSupports), on every compiled variant of the
// warp-specialized wgmma kernel (kWgmmaWs) too. Schedules and kernels against each other:
// paged_prefill_kernel_agreement_test.cc; the plan alone (no kernel): paged_prefill_plan_test.cc.
#include "kernels/cuda/paged_prefill_attention.h"

#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/paged_prefill_attention_test_util.h"

namespace lazyattn {
namespace {

using namespace prefill_testing;  // NOLINT(build/namespaces): the shared test helpers

TEST_F(PagedPrefillGpuTest, DocumentEncodingAllLengthsHeadDimsAndGroups) {
  TEST_SEED(rng);
  for (int d : {64, 128}) {
    for (int group : {1, 4, 8}) {
      for (int len : {1, 7, 16, 17, 100}) {
        CheckCase(
            rng,
            {.num_heads = 2 * group, .num_kv_heads = 2, .head_dim = d, .seqs = {Encoding(len)}},
            kAll);
      }
    }
  }
}

TEST_F(PagedPrefillGpuTest, DocumentEncodingOf4095Tokens) {
  TEST_SEED(rng);
  CheckCase(rng, {.num_heads = 8, .num_kv_heads = 2, .head_dim = 128, .seqs = {Encoding(4095)}},
            kAll);
  CheckCase(rng, {.num_heads = 8, .num_kv_heads = 1, .head_dim = 64, .seqs = {Encoding(4095)}},
            kAll);
}

TEST_F(PagedPrefillGpuTest, QueriesOverDocumentsAtLargeDeltas) {
  TEST_SEED(rng);
  const std::vector<int> lens = {1, 7, 16, 17, 100};
  for (int d : {64, 128}) {
    for (int group : {1, 4, 8}) {
      for (int docs : {1, 5, 64}) {
        for (int nq : {1, 7, 17, 100}) {
          CheckCase(rng,
                    {.num_heads = 2 * group,
                     .num_kv_heads = 2,
                     .head_dim = d,
                     .seqs = {Request(rng, docs, lens, nq, nq)}},
                    kRotating);
        }
      }
    }
  }
}

TEST_F(PagedPrefillGpuTest, LongDocumentsAndLongQuery) {
  TEST_SEED(rng);
  // 4095 queries over three documents, one of 4095 tokens; and 16 queries over 64 documents
  // (split-KV path).
  CheckCase(rng,
            {.num_heads = 4,
             .num_kv_heads = 1,
             .head_dim = 128,
             .seqs = {Request(rng, 3, {100, 4095, 17}, 4095, 4095)}},
            kRotating);
  CheckCase(rng,
            {.num_heads = 8,
             .num_kv_heads = 2,
             .head_dim = 128,
             .seqs = {Request(rng, 64, {1, 7, 16, 17, 100, 400}, 16, 16)}},
            kRotating);
  CheckCase(rng,
            {.num_heads = 8,
             .num_kv_heads = 1,
             .head_dim = 64,
             .seqs = {Request(rng, 5, {4095, 1000}, 7, 7)}},
            kRotating);
}

TEST_F(PagedPrefillGpuTest, ChunkedQueriesSeeTheirEarlierOwnTokens) {
  TEST_SEED(rng);
  // The own segment holds 130 tokens of which only the last 17 (or 1) are new queries.
  CheckCase(rng,
            {.num_heads = 32,
             .num_kv_heads = 8,
             .head_dim = 128,
             .seqs = {Request(rng, 3, {16, 100}, 130, 17), Request(rng, 2, {33}, 130, 1)}},
            kRotating);
}

// Runs of plain tiles of lengths 1 to 7 (documents of whole tiles; the 3rd and 4th share a delta,
// one run of 7), breaks at odd and even tiles, a partial last tile, and split-KV ranges that
// start inside runs: plain runs and breaks are where kWgmmaWs's tile loop branches.
TEST_F(PagedPrefillGpuTest, PlainRunsOfEveryLengthAndParity) {
  TEST_SEED(rng);
  std::uniform_int_distribution<uint32_t> delta(1, 200000);
  SeqSpec s;
  uint32_t d = 0;
  const int lens[] = {64, 128, 192, 256, 320, 384, 448, 64, 100};
  for (int i = 0; i < 9; ++i) {
    if (i != 3) d = delta(rng);
    s.seg_len.push_back(lens[i]);
    s.seg_delta.push_back(d);
  }
  s.seg_len.push_back(200);
  s.seg_delta.push_back(delta(rng));
  s.num_queries = 150;
  const CaseSpec c{.num_heads = 32, .num_kv_heads = 8, .head_dim = 128, .seqs = {s}};
  // Rotating forms only: the deltas are not 0, and kNone ignores them (another function).
  CheckCase(rng, c, kRotating, /*max_splits=*/1);
  CheckCase(rng, c, kRotating, /*max_splits=*/32);
}

TEST_F(PagedPrefillGpuTest, BatchOfSequencesOfDifferentLengths) {
  TEST_SEED(rng);
  const std::vector<int> lens = {1, 7, 16, 17, 100, 300};
  for (int batch : {1, 3, 16}) {
    for (auto [d, heads, kv] : {std::tuple{128, 32, 8}, std::tuple{64, 4, 4}}) {
      CaseSpec c{.num_heads = heads, .num_kv_heads = kv, .head_dim = d};
      for (int s = 0; s < batch; ++s) {
        const int nq = std::vector<int>{1, 7, 16, 17, 100}[rng() % 5];
        if (s % 3 == 0) {
          c.seqs.push_back(Encoding(std::vector<int>{1, 7, 17, 100, 250}[rng() % 5]));
        } else {
          c.seqs.push_back(Request(rng, 1 + rng() % 8, lens, nq, nq));
        }
      }
      CheckCase(rng, c, kRotating);
    }
  }
}

}  // namespace
}  // namespace lazyattn
