// The paged prefill plan (PagedPrefillPlan, host code): what it refuses, the occupancy it plans
// for, when it splits KV, and the plain-tile breaks the wgmma kernel walks. No kernel runs here;
// the kernels against their CPU twin are paged_prefill_attention_test.cc.
#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/paged_prefill_attention.h"
#include "kernels/include/kv_block_entry.h"

namespace lazyattn {
namespace {

TEST(PagedPrefillPlanTest, RejectsWhatTheKernelCannotDo) {
  const KvBlockEntry ok[1] = {PackKvBlockEntry(0, 5, 16)};
  const PagedPrefillSequence seq{
      .num_queries = 4, .first_query_index = 12, .block_table = ok, .num_blocks = 1};
  PagedPrefillPlan plan;
  const PagedPrefillPlanOptions opt{.sm_count = 132, .rope_max_positions = 100};
  EXPECT_TRUE(plan.Build({.num_heads = 8, .num_kv_heads = 2, .head_dim = 128}, &seq, 1, opt).ok());
  EXPECT_EQ(plan.Build({.num_heads = 8, .num_kv_heads = 2, .head_dim = 96}, &seq, 1, opt).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(plan.Build({.num_heads = 6, .num_kv_heads = 4, .head_dim = 64}, &seq, 1, opt).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(plan.Build({.num_heads = 8, .num_kv_heads = 2, .head_dim = 64, .block_size = 32}, &seq,
                       1, opt)
                .code(),
            absl::StatusCode::kInvalidArgument);
  const KvBlockEntry far[1] = {PackKvBlockEntry(0, 100, 16)};
  PagedPrefillSequence bad = seq;
  bad.block_table = far;
  EXPECT_EQ(plan.Build({.num_heads = 8, .num_kv_heads = 2, .head_dim = 64}, &bad, 1, opt).code(),
            absl::StatusCode::kInvalidArgument);
  const KvBlockEntry empty[1] = {PackKvBlockEntry(0, 0, 0)};
  bad.block_table = empty;
  EXPECT_EQ(plan.Build({.num_heads = 8, .num_kv_heads = 2, .head_dim = 64}, &bad, 1, opt).code(),
            absl::StatusCode::kInvalidArgument);
  const KvBlockEntry past_pool[1] = {PackKvBlockEntry(7, 0, 16)};
  bad.block_table = past_pool;
  EXPECT_EQ(plan.Build({.num_heads = 8, .num_kv_heads = 2, .head_dim = 64, .num_pool_blocks = 7},
                       &bad, 1, opt)
                .code(),
            absl::StatusCode::kInvalidArgument);
  PagedPrefillPlanOptions no_ctas = opt;
  no_ctas.ctas_per_sm = 0;
  EXPECT_EQ(
      plan.Build({.num_heads = 8, .num_kv_heads = 2, .head_dim = 128}, &seq, 1, no_ctas).code(),
      absl::StatusCode::kInvalidArgument);
}

// The warp-specialized kernel runs one CTA an SM (its plans are built for that) where it runs,
// and where it falls back to mma.sync, mma.sync's two.
TEST(PagedPrefillPlanTest, CtasPerSmFollowsTheKernelThatRuns) {
  EXPECT_EQ(PrefillCtasPerSm(PrefillKernel::kMmaSync, 128, PrefillRotation::kRotateQ), 2);
  EXPECT_EQ(PrefillCtasPerSm(PrefillKernel::kMmaSync, 64, PrefillRotation::kRotateK), 2);
  EXPECT_EQ(PrefillCtasPerSm(PrefillKernel::kWgmmaWs, 128, PrefillRotation::kRotateQ), 1);
  EXPECT_EQ(PrefillCtasPerSm(PrefillKernel::kWgmmaWs, 128, PrefillRotation::kNone), 1);
  // Where kWgmmaWs falls back to mma.sync, so does the occupancy.
  EXPECT_EQ(PrefillCtasPerSm(PrefillKernel::kWgmmaWs, 64, PrefillRotation::kRotateQ), 2);
  EXPECT_EQ(PrefillCtasPerSm(PrefillKernel::kWgmmaWs, 128, PrefillRotation::kRotateK), 2);
}

TEST(PagedPrefillPlanTest, SplitsKvOnlyWhenQueryTilesLeaveTheChipIdle) {
  std::vector<KvBlockEntry> table;
  for (int b = 0; b < 1284; ++b) table.push_back(PackKvBlockEntry(b, 0, 16));
  const PagedPrefillShape shape{.num_heads = 32, .num_kv_heads = 8, .head_dim = 128};
  const PagedPrefillPlanOptions opt{.sm_count = 132, .rope_max_positions = 1};
  PagedPrefillPlan plan;
  // 64 queries over 20,544 keys: 2 query tiles x 8 KV heads, so KV is split 16 ways.
  PagedPrefillSequence few{.num_queries = 64,
                           .first_query_index = 20480,
                           .block_table = table.data(),
                           .num_blocks = 1284};
  ASSERT_TRUE(plan.Build(shape, &few, 1, opt).ok());
  EXPECT_EQ(plan.num_split_groups(), 2);
  EXPECT_EQ(plan.num_work_items(), 32);
  EXPECT_GT(plan.workspace_bytes(), 0);
  // For a kernel of one CTA an SM (wgmma) half the splits: 2 x 8 x 8 = 128 CTAs, one wave.
  PagedPrefillPlanOptions one = opt;
  one.ctas_per_sm = 1;
  ASSERT_TRUE(plan.Build(shape, &few, 1, one).ok());
  EXPECT_EQ(plan.num_split_groups(), 2);
  EXPECT_EQ(plan.num_work_items(), 16);
  // 4096 queries: 128 query tiles per KV head fill the chip; no split, no workspace.
  std::vector<KvBlockEntry> big = table;
  for (int b = 0; b < 252; ++b) big.push_back(PackKvBlockEntry(2000 + b, 0, 16));
  PagedPrefillSequence many{.num_queries = 4096,
                            .first_query_index = 20480,
                            .block_table = big.data(),
                            .num_blocks = 1536};
  ASSERT_TRUE(plan.Build(shape, &many, 1, opt).ok());
  EXPECT_EQ(plan.num_split_groups(), 0);
  EXPECT_EQ(plan.num_work_items(), 128);
  EXPECT_EQ(plan.workspace_bytes(), 0);
}

// The plan's plain-tile breaks (wgmma kRotateQ): for every work item, walking its tiles the way
// the kernel does (next_break from work word 6, then breaks[tile + 1] after each tile that is not
// plain) must call a tile plain exactly when all its entries carry the delta that the kernel's
// q' has there: 0 at the range's first tile, later the delta of the previous tile's last pass
// (passes go in order of each delta's first entry).
TEST(PagedPrefillPlanTest, BreaksMarkExactlyTheTilesThatAreNotPlain) {
  auto entry = [](int block, int delta, int valid) {
    return PackKvBlockEntry(block, delta, valid);
  };
  // Hand-checked: tile 0 [3 3 9 3] leaves q' at 9, so the uniform tile 1 [3 3 3 3] is a break;
  // tile 2 [3 3] (partial blocks) follows 3 and is plain.
  const std::vector<KvBlockEntry> small = {entry(0, 3, 16), entry(1, 3, 16), entry(2, 9, 7),
                                           entry(3, 3, 16), entry(4, 3, 16), entry(5, 3, 16),
                                           entry(6, 3, 16), entry(7, 3, 16), entry(8, 3, 16),
                                           entry(9, 3, 5)};
  // Documents: an encoding (all 0), segments of random deltas and lengths (partial blocks at
  // segment ends), and a table whose first tile is uniform at a nonzero delta.
  std::mt19937 rng(7);
  std::vector<std::vector<KvBlockEntry>> tables = {small};
  std::vector<KvBlockEntry> encode;
  for (int b = 0; b < 300; ++b) encode.push_back(entry(b, 0, b == 299 ? 9 : 16));
  tables.push_back(encode);
  for (int doc = 0; doc < 3; ++doc) {
    std::vector<KvBlockEntry> t;
    int block = 0;
    while (t.size() < 260) {
      const int delta = doc == 2 && t.empty() ? 11 : static_cast<int>(rng() % 4) * 1000;
      const int blocks = 1 + static_cast<int>(rng() % 9);
      for (int b = 0; b < blocks; ++b) {
        t.push_back(entry(block++, delta, b + 1 == blocks ? 1 + static_cast<int>(rng() % 16) : 16));
      }
    }
    tables.push_back(t);
  }
  std::vector<PagedPrefillSequence> seqs;
  for (const auto& t : tables) {
    int keys = 0;
    for (const KvBlockEntry& e : t) keys += static_cast<int>(KvEntryValid(e));
    seqs.push_back({.num_queries = 3,
                    .first_query_index = keys,
                    .block_table = t.data(),
                    .num_blocks = static_cast<int>(t.size())});
  }
  const PagedPrefillShape shape{.num_heads = 32, .num_kv_heads = 8, .head_dim = 128};
  for (const int ctas : {1, 2}) {
    SCOPED_TRACE("ctas_per_sm=" + std::to_string(ctas));
    PagedPrefillPlan plan;
    ASSERT_TRUE(plan.Build(shape, seqs.data(), static_cast<int>(seqs.size()),
                           {.sm_count = 132, .rope_max_positions = 4000, .ctas_per_sm = ctas})
                    .ok());
    ASSERT_GT(plan.num_split_groups(), 0);  // ranges that start mid-sequence are covered
    const int32_t* m = plan.metadata();
    const PagedPrefillPlan::Layout& lay = plan.layout();
    const int32_t* small_breaks = m + lay.breaks + m[lay.seqs + 5];
    EXPECT_EQ(std::vector<int32_t>(small_breaks, small_breaks + 5),
              (std::vector<int32_t>{0, 1, 3, 3, 3}));
    int mid_starts = 0;
    for (int i = 0; i < plan.num_work_items(); ++i) {
      const int32_t* w = m + lay.work + i * 8;
      const int seq = w[0], t_begin = w[3], t_end = w[4];
      const int32_t* sq = m + lay.seqs + seq * 8;
      const int32_t* ent = m + lay.entries + int64_t{sq[2]} * 4;
      const int32_t* breaks = m + lay.breaks + sq[5];
      const int num_entries = sq[3], tiles = (num_entries + 3) / 4;
      ASSERT_LE(t_end, tiles);
      EXPECT_EQ(breaks[tiles], tiles);
      EXPECT_EQ(breaks[tiles + 1], tiles);
      mid_starts += t_begin > 0 ? 1 : 0;
      // The kernel's decisions, its statements in its order (paged_prefill_wgmma_ws.cu): next_plain
      // and next_break set before the loop, then plan_next (deciding tile t + 1) run from the
      // passes of tile t, by the first pass only. A model that advanced next_break once a tile,
      // not where the kernel does, hid a kernel that ran plan_next in every pass (a tile of
      // several passes then took the break after it for a plain tile).
      int cur = 0, next_break = w[6];
      bool next_plain = t_begin < next_break;
      if (!next_plain) next_break = breaks[t_begin + 1];
      for (int t = t_begin; t < t_end; ++t) {
        SCOPED_TRACE("work " + std::to_string(i) + " seq " + std::to_string(seq) + " tile " +
                     std::to_string(t));
        bool plain = true;
        for (int e = 4 * t; e < std::min(4 * t + 4, num_entries); ++e) {
          plain &= ent[4 * e + 1] == cur;
        }
        ASSERT_GT(next_break, t);
        EXPECT_EQ(next_plain, plain);
        auto plan_next = [&] {
          next_plain = t + 1 < next_break;
          if (!next_plain) next_break = breaks[next_break + 1];
        };
        if (next_plain) {
          plan_next();
        } else {  // the kernel's passes, in order of each delta's first entry
          int todo = 0;
          for (int e = 0; e < 4 && 4 * t + e < num_entries; ++e) todo |= 1 << e;
          bool first_pass = true;
          do {
            const int first = __builtin_ctz(todo);
            cur = ent[4 * (4 * t + first) + 1];
            for (int e = 0; e < 4; ++e) {
              if ((todo >> e & 1) && ent[4 * (4 * t + e) + 1] == cur) todo &= ~(1 << e);
            }
            if (first_pass) plan_next();
            first_pass = false;
          } while (todo != 0);
        }
      }
    }
    EXPECT_GT(mid_starts, 0);
  }
}

}  // namespace
}  // namespace lazyattn
