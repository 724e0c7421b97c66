// Paged prefill attention (CUDA): schedules and kernels that must agree. A split and an unsplit
// schedule, each kernel on the plan built for the other, K rotated inside the kernel against K
// stored rotated at global positions (the design's point), the wgmma kernel against mma.sync on
// the benchmark's shape; and a variant out of range refused before any launch. Same inputs, twin
// and tolerance as paged_prefill_attention_test.cc (paged_prefill_attention_test_util.h).
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/paged_prefill_attention.h"
#include "kernels/cuda/paged_prefill_attention_test_util.h"

namespace lazyattn {
namespace {

using namespace prefill_testing;  // NOLINT(build/namespaces): the shared test helpers

TEST_F(PagedPrefillGpuTest, SplitAndUnsplitScheduleAgree) {
  TEST_SEED(rng);
  const CaseSpec c{.num_heads = 32,
                   .num_kv_heads = 8,
                   .head_dim = 128,
                   .seqs = {Request(rng, 5, {1000, 600}, 64, 64)}};
  CheckCase(rng, c, kRotating, /*max_splits=*/1);
  CheckCase(rng, c, kRotating, /*max_splits=*/32);
}

// A plan is a schedule, not a kernel's: each kernel on the plan built for the other one's
// occupancy (PagedPrefillPlanOptions::ctas_per_sm 1 or 2: 8 or about 10-16 splits a query tile
// here) computes the twin's function as on its own.
TEST_F(PagedPrefillGpuTest, EitherKernelRunsThePlanBuiltForTheOther) {
  TEST_SEED(rng);
  const CaseSpec c{.num_heads = 32,
                   .num_kv_heads = 8,
                   .head_dim = 128,
                   .seqs = {Request(rng, 5, {1000, 600}, 64, 64)}};
  const uint32_t seed = rng();
  SCOPED_TRACE(Describe(c) + " seed=" + std::to_string(seed));
  const Inputs in = MakeInputs(c, seed, /*global_k=*/false);
  const std::vector<float> ref = CpuReference(c, in);
  const PrefillRotation r = PrefillRotation::kRotateQ;
  for (KernelRun k : KernelsFor(128, r)) {
    int work[3] = {0, 0, 0};
    for (int ctas_per_sm : {1, 2}) {
      std::vector<float> got;
      int groups = 0;
      RunGpu(c, in, r, k, 32, &got, &work[ctas_per_sm], &groups, ctas_per_sm);
      ASSERT_FALSE(HasFatalFailure());
      const Error e = Compare(got, ref);
      std::printf("  %-16s %-8s plan for %d CTAs/SM: work=%d splits=%d rel_l2=%.2e max_abs=%.2e\n",
                  Name(k).c_str(), Name(r), ctas_per_sm, work[ctas_per_sm], groups, e.rel_l2,
                  e.max_abs);
      EXPECT_GT(groups, 0) << "the case should split KV";
      EXPECT_LE(e.rel_l2, kMaxRelL2) << Name(k) << " on a plan for " << ctas_per_sm;
      EXPECT_EQ(e.bad, 0) << Name(k) << " on a plan for " << ctas_per_sm;
    }
    EXPECT_LT(work[1], work[2]) << "the two plans should differ";
  }
}

// The point of the design: K cached at document-local positions and rotated by delta inside the
// kernel gives the attention over K rotated at global positions directly.
TEST_F(PagedPrefillGpuTest, DeferredRotationEqualsKeysRotatedAtGlobalPositions) {
  TEST_SEED(rng);
  for (int d : {64, 128}) {
    CaseSpec c{.num_heads = 8, .num_kv_heads = 2, .head_dim = d};
    SeqSpec s;
    uint32_t offset = 150000;  // a long prompt: positions far past 65,535
    for (int len : {100, 17, 1, 700, 40}) {
      s.seg_len.push_back(len);
      s.seg_delta.push_back(offset);
      offset += len;
    }
    s.num_queries = 40;  // the last segment is the question
    c.seqs = {s};
    const uint32_t seed = rng();
    SCOPED_TRACE("seed=" + std::to_string(seed));
    const Inputs local = MakeInputs(c, seed, /*global_k=*/false);
    const Inputs global = MakeInputs(c, seed, /*global_k=*/true);
    const std::vector<float> ref_global = CpuReference(c, global);
    for (KernelRun direct_kernel : KernelsFor(d, PrefillRotation::kNone)) {
      std::vector<float> direct;
      RunGpu(c, global, PrefillRotation::kNone, direct_kernel, 32, &direct);
      ASSERT_FALSE(HasFatalFailure());
      Error e = Compare(direct, ref_global);
      EXPECT_LE(e.rel_l2, kMaxRelL2) << Name(direct_kernel);
      EXPECT_EQ(e.bad, 0) << Name(direct_kernel);
      for (PrefillRotation r : kRotating) {
        for (KernelRun k : KernelsFor(d, r)) {
          std::vector<float> deferred;
          RunGpu(c, local, r, k, 32, &deferred);
          ASSERT_FALSE(HasFatalFailure());
          e = Compare(deferred, ref_global);
          std::printf(
              "  deferred %-16s %-8s vs global-K reference d=%d: rel_l2=%.2e max_abs=%.2e\n",
              Name(k).c_str(), Name(r), d, e.rel_l2, e.max_abs);
          EXPECT_LE(e.rel_l2, kMaxRelL2) << Name(k) << " " << Name(r);
          EXPECT_EQ(e.bad, 0) << Name(k) << " " << Name(r);
          e = Compare(deferred, direct);
          EXPECT_LE(e.rel_l2, kMaxRelL2)
              << Name(k) << " " << Name(r) << " vs " << Name(direct_kernel) << " on global K";
          EXPECT_EQ(e.bad, 0) << Name(k) << " " << Name(r) << " vs " << Name(direct_kernel)
                              << " on global K";
        }
      }
    }
  }
}

// The wgmma kernel (every kWgmmaWs variant) against the mma.sync kernel (same tolerance as
// against the twin) where the CPU twin would take minutes: the benchmark's shape, 4,096 queries
// (GQA 32/8) after 5 documents of 4,096 tokens at their own deltas, both rotations it covers
// (kNone ignores the deltas in both kernels: the same function). Then partial blocks: documents
// of 100 and 17 tokens (last blocks of 4 and 1 slots, so tiles mix entries, deltas and invalid
// slots), against the twin and the other kernel, at random deltas (kRotateQ) and at delta 0
// (kNone computes the twin's function).
TEST_F(PagedPrefillGpuTest, WgmmaMatchesMmaSyncOnTheBenchmarkShapeAndPartialBlocks) {
  ASSERT_TRUE(PrefillWgmmaSupports(128, PrefillRotation::kRotateQ));
  ASSERT_TRUE(PrefillWgmmaSupports(128, PrefillRotation::kNone));
  TEST_SEED(rng);
  auto compare_kernels = [&rng](const CaseSpec& c, PrefillRotation r) {
    const uint32_t seed = rng();
    SCOPED_TRACE(Describe(c) + " seed=" + std::to_string(seed) + " " + Name(r));
    const Inputs in = MakeInputs(c, seed, /*global_k=*/false);
    std::vector<float> mma;
    RunGpu(c, in, r, PrefillKernel::kMmaSync, 32, &mma);
    ASSERT_FALSE(::testing::Test::HasFatalFailure());
    for (KernelRun k : KernelsFor(c.head_dim, r)) {
      if (k.kernel == PrefillKernel::kMmaSync) continue;
      std::vector<float> wgmma;
      RunGpu(c, in, r, k, 32, &wgmma);
      ASSERT_FALSE(::testing::Test::HasFatalFailure());
      const Error e = Compare(wgmma, mma);
      std::printf("  %s vs mma.sync %-8s rel_l2=%.2e max_abs=%.2e  %s\n", Name(k).c_str(), Name(r),
                  e.rel_l2, e.max_abs, Describe(c).c_str());
      EXPECT_LE(e.rel_l2, kMaxRelL2) << Name(k);
      EXPECT_EQ(e.bad, 0) << Name(k) << ": " << e.bad << " elements off by more than " << kMaxAbs
                          << ", first at " << e.first_bad << " (" << wgmma[e.first_bad]
                          << ", mma.sync " << mma[e.first_bad] << ")";
    }
  };
  const CaseSpec bench{.num_heads = 32,
                       .num_kv_heads = 8,
                       .head_dim = 128,
                       .seqs = {Request(rng, 5, {4096}, 4096, 4096)}};
  compare_kernels(bench, PrefillRotation::kRotateQ);
  compare_kernels(bench, PrefillRotation::kNone);

  std::uniform_int_distribution<uint32_t> delta(1, 200000);
  CaseSpec partial{.num_heads = 32,
                   .num_kv_heads = 8,
                   .head_dim = 128,
                   .seqs = {SeqSpec{{100, 17, 100, 17, 40}, {}, 40}}};
  for (int i = 0; i < 5; ++i) partial.seqs[0].seg_delta.push_back(delta(rng));
  CheckCase(rng, partial, {PrefillRotation::kRotateQ});
  compare_kernels(partial, PrefillRotation::kRotateQ);
  partial.seqs[0].seg_delta.assign(5, 0);
  CheckCase(rng, partial, {PrefillRotation::kRotateQ, PrefillRotation::kNone});
  compare_kernels(partial, PrefillRotation::kNone);
}

// A kWgmmaWs variant outside 0..PrefillWgmmaWsVariants()-1 is refused before anything is
// launched (no GPU needed: the pointers are never dereferenced).
TEST(PagedPrefillArgsTest, WgmmaWsVariantOutOfRangeIsInvalidArgument) {
  ASSERT_GE(PrefillWgmmaWsVariants(), 1);
  EXPECT_STRNE(PrefillWgmmaWsVariantName(0), "?");
  EXPECT_STREQ(PrefillWgmmaWsVariantName(PrefillWgmmaWsVariants()), "?");
  const KvBlockEntry table[2] = {PackKvBlockEntry(0, 0, 16), PackKvBlockEntry(1, 0, 3)};
  PagedPrefillSequence seq{
      .num_queries = 19, .first_query_index = 0, .block_table = table, .num_blocks = 2};
  PagedPrefillPlan plan;
  ASSERT_TRUE(plan.Build({.num_heads = 8, .num_kv_heads = 2, .head_dim = 128, .num_pool_blocks = 2},
                         &seq, 1, {.rope_max_positions = 16})
                  .ok());
  ASSERT_GT(plan.num_work_items(), 0);
  ASSERT_EQ(plan.workspace_bytes(), 0);
  alignas(16) static uint8_t fake[16];  // never read: the call must fail first
  PagedPrefillArgs args;
  args.q = args.k_pool = args.v_pool = reinterpret_cast<const __nv_bfloat16*>(fake);
  args.out = reinterpret_cast<__nv_bfloat16*>(fake);
  args.device_metadata = fake;
  args.scale = 1.f;
  args.kernel = PrefillKernel::kWgmmaWs;
  for (int bad : {-1, PrefillWgmmaWsVariants()}) {
    args.variant = bad;
    const absl::Status st = PagedPrefillAttention(plan, args, PrefillRotation::kNone, nullptr);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_NE(st.message().find("variant"), std::string::npos) << st;
  }
}

}  // namespace
}  // namespace lazyattn
