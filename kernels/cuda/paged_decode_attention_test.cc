#include "kernels/cuda/paged_decode_attention.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/cuda/rope_table_cuda.h"
#include "kernels/include/paged_attention.h"
#include "kernels/include/rope.h"

namespace lazyattn {
namespace {

using testing::Bf16BitsToFloat;
using testing::DeviceBuffer;
using testing::FloatToBf16Bits;
using testing::kBf16NaN;

constexpr int kBlock = 16;
constexpr int kMaxDelta = 200000;
constexpr int kMaxContext = 20000;

// RoPE tables shared by every test of a head dim (building one takes ~0.5 s).
struct Rope {
  std::unique_ptr<RopeTable> host;
  std::unique_ptr<DeviceRopeTable> device;
};
const Rope& GetRope(int d) {
  static std::map<int, Rope>* tables = new std::map<int, Rope>();
  Rope& r = (*tables)[d];
  if (!r.host) {
    r.host = std::make_unique<RopeTable>(RopeParams{.head_dim = d, .theta = 500000},
                                         kMaxDelta + kMaxContext + kBlock);
    auto dev = DeviceRopeTable::Create(*r.host);
    EXPECT_TRUE(dev.ok()) << dev.status();
    if (dev.ok()) r.device = std::move(*dev);
  }
  return r;
}

// A sequence: documents (segments) of given lengths, each at its own delta, each starting on a
// fresh block (so every document's last block may be partial).
struct Sequence {
  std::vector<int> lengths;
  std::vector<uint32_t> deltas;
  int total() const { return std::accumulate(lengths.begin(), lengths.end(), 0); }
};

// Splits `context` tokens into `docs` documents of random lengths with random deltas in
// [0, kMaxDelta]. The first is at delta 0, and so, in about half the sequences of 3 or more, is
// the last (a request's own tokens, stored at their positions): the kernel skips the rotation at
// delta 0, also on the way back to it from a rotated document.
Sequence MakeSequence(int context, int docs, std::mt19937& rng) {
  Sequence s;
  docs = std::max(1, std::min(docs, context));
  std::vector<int> cuts;
  std::uniform_int_distribution<int> pos(1, std::max(1, context - 1));
  while (int(cuts.size()) < docs - 1) {
    const int c = pos(rng);
    if (std::find(cuts.begin(), cuts.end(), c) == cuts.end()) cuts.push_back(c);
  }
  std::sort(cuts.begin(), cuts.end());
  int prev = 0;
  for (int c : cuts) {
    s.lengths.push_back(c - prev);
    prev = c;
  }
  s.lengths.push_back(context - prev);
  std::uniform_int_distribution<uint32_t> delta(0, kMaxDelta);
  const bool tail_at_zero = docs >= 3 && rng() % 2 == 0;
  for (int i = 0; i < docs; ++i) {
    s.deltas.push_back(i == 0 || (tail_at_zero && i == docs - 1) ? 0 : delta(rng));
  }
  return s;
}

struct Problem {
  int batch = 0, num_heads = 0, num_kv_heads = 0, head_dim = 0, max_blocks = 0;
  std::vector<Sequence> seqs;
  // Host data (bf16 bits), pools laid out [block][kv_head][slot][d].
  std::vector<uint16_t> q, k_local, k_global, v;
  std::vector<KvBlockEntry> tables;  // [batch][max_blocks]
  std::vector<int32_t> num_blocks;
  int pool_blocks = 0;
};

// Builds a problem with random q/K/V. K is stored rotated at document-local positions
// (k_local, what the lazy cache holds) and, for the equivalence check, at global positions
// delta + local (k_global). Physical blocks are shuffled; every slot nothing writes is NaN,
// including a spare block that the unused table entries point at.
Problem MakeProblem(int num_heads, int num_kv_heads, int d, std::vector<Sequence> seqs,
                    uint32_t seed, int extra_table_stride = 3) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0, 1);
  const RopeTable& rope = *GetRope(d).host;
  Problem p;
  p.batch = int(seqs.size());
  p.num_heads = num_heads;
  p.num_kv_heads = num_kv_heads;
  p.head_dim = d;
  p.seqs = std::move(seqs);
  int total_blocks = 0;
  for (const Sequence& s : p.seqs) {
    int nb = 0;
    for (int len : s.lengths) nb += (len + kBlock - 1) / kBlock;
    p.max_blocks = std::max(p.max_blocks, nb);
    total_blocks += nb;
  }
  p.max_blocks += extra_table_stride;
  p.pool_blocks = total_blocks + 5;
  std::vector<uint32_t> physical(p.pool_blocks);
  std::iota(physical.begin(), physical.end(), 0u);
  std::shuffle(physical.begin(), physical.end(), rng);
  const uint32_t nan_block = physical.back();  // never written

  const size_t pool_elems = size_t(p.pool_blocks) * num_kv_heads * kBlock * d;
  p.k_local.assign(pool_elems, kBf16NaN);
  p.k_global.assign(pool_elems, kBf16NaN);
  p.v.assign(pool_elems, kBf16NaN);
  p.tables.assign(size_t(p.batch) * p.max_blocks, PackKvBlockEntry(nan_block, 0, kBlock));
  p.num_blocks.assign(p.batch, 0);
  p.q.resize(size_t(p.batch) * num_heads * d);
  // q ~ N(0, 2^2): scores of std ~2 give a softmax far from uniform.
  for (uint16_t& x : p.q) x = FloatToBf16Bits(2.0f * normal(rng));

  int next = 0;
  std::vector<float> k(d), kl(d), kg(d);
  for (int b = 0; b < p.batch; ++b) {
    const Sequence& s = p.seqs[b];
    int entry = 0;
    for (size_t doc = 0; doc < s.lengths.size(); ++doc) {
      const int len = s.lengths[doc];
      const uint32_t delta = s.deltas[doc];
      for (int blk = 0; blk < (len + kBlock - 1) / kBlock; ++blk) {
        const uint32_t phys = physical[next++];
        const int valid = std::min(kBlock, len - blk * kBlock);
        p.tables[size_t(b) * p.max_blocks + entry++] = PackKvBlockEntry(phys, delta, valid);
        for (int slot = 0; slot < valid; ++slot) {
          const int local = blk * kBlock + slot;
          for (int h = 0; h < num_kv_heads; ++h) {
            for (int x = 0; x < d; ++x) k[x] = normal(rng);
            kl = k;
            kg = k;
            RopeRotateHeadCpu(kl.data(), local, rope);
            RopeRotateHeadCpu(kg.data(), int64_t(delta) + local, rope);
            const size_t off = ((size_t(phys) * num_kv_heads + h) * kBlock + slot) * d;
            for (int x = 0; x < d; ++x) {
              p.k_local[off + x] = FloatToBf16Bits(kl[x]);
              p.k_global[off + x] = FloatToBf16Bits(kg[x]);
              p.v[off + x] = FloatToBf16Bits(normal(rng));
            }
          }
        }
      }
    }
    p.num_blocks[b] = entry;
  }
  return p;
}

std::vector<float> ToFloat(const std::vector<uint16_t>& bits) {
  std::vector<float> f(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) f[i] = Bf16BitsToFloat(bits[i]);
  return f;
}

// The CPU twin on the same bf16-rounded inputs (K at local positions, rotated per block).
std::vector<float> CpuReference(const Problem& p) {
  const int d = p.head_dim;
  const std::vector<float> q = ToFloat(p.q), k = ToFloat(p.k_local), v = ToFloat(p.v);
  std::vector<float> out(size_t(p.batch) * p.num_heads * d, 0.f);
  for (int b = 0; b < p.batch; ++b) {
    PagedAttentionArgs a;
    a.q = q.data() + size_t(b) * p.num_heads * d;
    a.num_queries = 1;
    a.num_heads = p.num_heads;
    a.first_query_index = p.seqs[b].total() - 1;
    a.block_table = p.tables.data() + size_t(b) * p.max_blocks;
    a.num_blocks = p.num_blocks[b];
    a.k_pool = k.data();
    a.v_pool = v.data();
    a.shape = PagedKvShape{.num_kv_heads = p.num_kv_heads, .head_dim = d, .block_size = kBlock};
    a.scale = 1.0f / std::sqrt(float(d));
    a.rope = GetRope(d).host.get();
    a.out = out.data() + size_t(b) * p.num_heads * d;
    PagedAttentionCpu(a);
  }
  return out;
}

struct DeviceProblem {
  DeviceBuffer<uint16_t> q, k_local, k_global, v;
  DeviceBuffer<KvBlockEntry> tables;
  DeviceBuffer<int32_t> num_blocks;
  explicit DeviceProblem(const Problem& p) {
    q.Upload(p.q);
    k_local.Upload(p.k_local);
    k_global.Upload(p.k_global);
    v.Upload(p.v);
    tables.Upload(p.tables);
    num_blocks.Upload(p.num_blocks);
  }
};

struct RunOptions {
  bool rotate = true;
  bool global_k = false;  // read k_global (with rotate = false)
  int num_splits = 0;
  DecodeOutputType out_type = DecodeOutputType::kFp32;
  bool early_kv_loads = false;
};

PagedDecodeArgs MakeArgs(const Problem& p, const DeviceProblem& dp, const RunOptions& o,
                         void* out) {
  PagedDecodeArgs a;
  a.q = reinterpret_cast<const __nv_bfloat16*>(dp.q.get());
  a.k_pool = reinterpret_cast<const __nv_bfloat16*>(o.global_k ? dp.k_global.get()
                                                                 : dp.k_local.get());
  a.v_pool = reinterpret_cast<const __nv_bfloat16*>(dp.v.get());
  a.block_tables = dp.tables.get();
  a.num_blocks = dp.num_blocks.get();
  a.batch = p.batch;
  a.num_heads = p.num_heads;
  a.num_kv_heads = p.num_kv_heads;
  a.head_dim = p.head_dim;
  a.max_blocks_per_seq = p.max_blocks;
  a.scale = 1.0f / std::sqrt(float(p.head_dim));
  a.rotate = o.rotate;
  a.rope = GetRope(p.head_dim).device->view();
  a.out = out;
  a.out_type = o.out_type;
  a.num_splits = o.num_splits;
  a.early_kv_loads = o.early_kv_loads;
  return a;
}

PagedDecodeWorkspace& Workspace() {
  static PagedDecodeWorkspace* ws = [] {
    auto w = PagedDecodeWorkspace::Create(0);
    EXPECT_TRUE(w.ok()) << w.status();
    return w.ok() ? w->release() : nullptr;
  }();
  return *ws;
}

// Runs the kernel into a poisoned output and returns it as floats.
std::vector<float> RunGpu(const Problem& p, const DeviceProblem& dp, const RunOptions& o,
                          int* splits_used = nullptr) {
  const size_t n = size_t(p.batch) * p.num_heads * p.head_dim;
  std::vector<float> result(n);
  PagedDecodeArgs a;
  if (o.out_type == DecodeOutputType::kFp32) {
    DeviceBuffer<float> out(n);
    out.Poison();
    a = MakeArgs(p, dp, o, out.get());
    const absl::Status s = PagedDecodeAttention(a, Workspace(), nullptr);
    EXPECT_TRUE(s.ok()) << s;
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    result = out.Download();
  } else {
    DeviceBuffer<uint16_t> out(n);
    out.Poison();
    a = MakeArgs(p, dp, o, out.get());
    const absl::Status s = PagedDecodeAttention(a, Workspace(), nullptr);
    EXPECT_TRUE(s.ok()) << s;
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    result = ToFloat(out.Download());
  }
  if (splits_used != nullptr) {
    auto plan = PlanPagedDecode(a, Workspace());
    *splits_used = plan.ok() ? plan->num_splits : -1;
  }
  return result;
}

// Tolerance, stated once for every decode test. Errors come from rounding the rotated query and
// the softmax weights to bf16 for the tensor cores (relative 2^-9 each) and from the bf16 output
// when it is bf16. Measured on an H200: 0.6e-3 to 4.6e-3 relative L2 over a whole output, up to
// 1.3e-2 on single rows (rows where a few keys dominate and their values partly cancel). Every
// element of every (sequence, head) row must satisfy |got - want| <= 0.06 * rms(want row) + 0.01 *
// |want|; each row's relative L2 error must be <= 3e-2 and the whole output's <= 1e-2.
// The element bound was 0.03 * rms: in a row of relative L2 1e-2 that is about the largest of its
// 128 errors, and batches of thousands of rows have such rows. Over 41 seeds of
// BatchSweepMatchesCpuTwin (H200, 2026-12-05) the element nearest it sat at 66-97 % of it at batch
// 256, and one seed went 0.3 % over (3361662654, H100). Twice that leaves room, and still fails
// a single element wrong by a tenth of its row's rms, which the row bound alone would not.
::testing::AssertionResult DecodeClose(const std::vector<float>& got,
                                       const std::vector<float>& want, int d,
                                       double* total_rel_l2 = nullptr) {
  double worst = 0, all_diff2 = 0, all_ref2 = 0;
  // The element nearest its bound (diff / bound), printed so that a run shows the margin left.
  double closest = 0, closest_row_rel = 0;
  size_t closest_row = 0;
  for (size_t row = 0; row * d < want.size(); ++row) {
    double ref2 = 0, diff2 = 0, row_closest = 0;
    for (int x = 0; x < d; ++x) ref2 += double(want[row * d + x]) * want[row * d + x];
    const double rms = std::sqrt(ref2 / d);
    for (int x = 0; x < d; ++x) {
      const size_t i = row * d + x;
      const double diff = std::fabs(double(got[i]) - want[i]);
      const double bound = 0.06 * rms + 0.01 * std::fabs(want[i]);
      if (bound > 0) row_closest = std::max(row_closest, diff / bound);
      if (!(diff <= bound)) {
        return ::testing::AssertionFailure()
               << "row " << row << " dim " << x << ": got " << got[i] << ", want " << want[i]
               << ", row rms " << rms;
      }
      diff2 += diff * diff;
    }
    const double rel = ref2 > 0 ? std::sqrt(diff2 / ref2) : std::sqrt(diff2);
    worst = std::max(worst, rel);
    if (row_closest > closest) {
      closest = row_closest;
      closest_row = row;
      closest_row_rel = rel;
    }
    all_diff2 += diff2;
    all_ref2 += ref2;
    if (!(rel <= 3e-2)) {
      return ::testing::AssertionFailure() << "row " << row << ": relative L2 " << rel;
    }
  }
  const double total = all_ref2 > 0 ? std::sqrt(all_diff2 / all_ref2) : std::sqrt(all_diff2);
  std::printf(
      "    [decode error] relative L2 %.2e overall, %.2e worst row; closest element %.0f %% of "
      "its bound (row %zu, relative L2 %.2e)\n",
      total, worst, 100 * closest, closest_row, closest_row_rel);
  if (total_rel_l2) *total_rel_l2 = total;
  if (!(total <= 1e-2)) {
    return ::testing::AssertionFailure() << "relative L2 " << total << " overall";
  }
  return ::testing::AssertionSuccess();
}

class DecodeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_GPU();
    seed_ = testing::FreshSeed();
    rng_.seed(seed_);
  }
  uint32_t seed_ = 0;
  std::mt19937 rng_;
};

// Context lengths 1, 7, 16, 17, 100, 4095, 20000 in one batch (1 to 64 documents each, deltas up
// to 200,000), for head dims 64 and 128, GQA 1, 4 and 8, split-KV automatic, off and forced.
TEST_F(DecodeTest, ContextSweepMatchesCpuTwin) {
  SCOPED_TRACE(::testing::Message() << "seed " << seed_);
  const std::vector<int> contexts = {1, 7, 16, 17, 100, 4095, 20000};
  const std::vector<int> docs = {1, 2, 1, 2, 5, 17, 64};
  for (int d : {64, 128}) {
    for (int group : {1, 4, 8}) {
      std::vector<Sequence> seqs;
      for (size_t i = 0; i < contexts.size(); ++i) {
        seqs.push_back(MakeSequence(contexts[i], docs[i], rng_));
      }
      const int kv_heads = 2;
      const Problem p = MakeProblem(group * kv_heads, kv_heads, d, seqs, rng_());
      const DeviceProblem dp(p);
      const std::vector<float> want = CpuReference(p);
      for (int splits : {0, 1, 7}) {
        SCOPED_TRACE(::testing::Message()
                     << "d " << d << " group " << group << " num_splits " << splits);
        int used = 0;
        RunOptions o;
        o.num_splits = splits;
        o.early_kv_loads = splits == 7;  // copies before the wait, with a split-KV merge
        const std::vector<float> got = RunGpu(p, dp, o, &used);
        if (splits == 1) {
          EXPECT_EQ(used, 1);
        } else {
          EXPECT_GT(used, 1);
        }
        double rel = 0;
        ASSERT_TRUE(DecodeClose(got, want, d, &rel));
        RecordProperty("rel_l2_d" + std::to_string(d) + "_g" + std::to_string(group) + "_s" +
                           std::to_string(splits),
                       std::to_string(rel));
      }
    }
  }
}

// Batches of 1, 33 and 256 sequences of random lengths (partial blocks everywhere), Llama-3-8B
// head shape (32/8, d = 128), bf16 output; K/V copies issued after and before the wait.
TEST_F(DecodeTest, BatchSweepMatchesCpuTwin) {
  SCOPED_TRACE(::testing::Message() << "seed " << seed_);
  for (int batch : {1, 33, 256}) {
    std::uniform_int_distribution<int> len(1, batch == 1 ? 3000 : 400);
    std::uniform_int_distribution<int> ndocs(1, 8);
    std::vector<Sequence> seqs;
    for (int b = 0; b < batch; ++b) seqs.push_back(MakeSequence(len(rng_), ndocs(rng_), rng_));
    const Problem p = MakeProblem(32, 8, 128, seqs, rng_());
    const DeviceProblem dp(p);
    const std::vector<float> want = CpuReference(p);
    for (bool early : {false, true}) {
      RunOptions o;
      o.out_type = DecodeOutputType::kBf16;
      o.early_kv_loads = early;
      SCOPED_TRACE(::testing::Message() << "batch " << batch << " early_kv_loads " << early);
      ASSERT_TRUE(DecodeClose(RunGpu(p, dp, o), want, 128));
    }
  }
}

// Deferred rotation equals attention over K rotated at global positions directly: the rotating
// kernel on document-local K and the non-rotating kernel on globally rotated K both match the
// CPU twin. 64 documents, deltas up to 200,000.
TEST_F(DecodeTest, DeferredRotationEqualsGlobalRotation) {
  SCOPED_TRACE(::testing::Message() << "seed " << seed_);
  for (int d : {64, 128}) {
    std::vector<Sequence> seqs = {MakeSequence(5000, 64, rng_), MakeSequence(1200, 9, rng_),
                                  MakeSequence(333, 3, rng_)};
    const Problem p = MakeProblem(32, 8, d, seqs, rng_());
    const DeviceProblem dp(p);
    const std::vector<float> want = CpuReference(p);
    RunOptions lazy;
    RunOptions global;
    global.rotate = false;
    global.global_k = true;
    const std::vector<float> a = RunGpu(p, dp, lazy), b = RunGpu(p, dp, global);
    SCOPED_TRACE(::testing::Message() << "d " << d);
    // Both against the same fp32 reference: a and b start from different bf16 roundings of K
    // (rotated before vs after rounding), so comparing them directly would need twice the
    // bf16 tolerance of either. Each carries one rounding the twin does not: the rotating kernel
    // rounds q rotated back by deltas up to 200,000 to bf16, the global baseline rounds K rotated
    // at those positions. (Under the element bound of 0.03 * rms these two needed 1.5 times it:
    // on the H200 the baseline once went 5 % over it, the rotating kernel once 15 %, seed
    // 3941222009, worst-row relative L2 1.2e-2; see DecodeClose.)
    EXPECT_TRUE(DecodeClose(a, want, d));
    EXPECT_TRUE(DecodeClose(b, want, d));
    // And rotation matters: ignoring the deltas on local K is far off.
    RunOptions wrong;
    wrong.rotate = false;
    EXPECT_FALSE(DecodeClose(RunGpu(p, dp, wrong), want, d));
  }
}

// GQA groups above 8 use the second half of the mma rows; above 16 a second head tile.
TEST_F(DecodeTest, LargeGroupsMatchCpuTwin) {
  SCOPED_TRACE(::testing::Message() << "seed " << seed_);
  for (int group : {12, 16, 20}) {
    std::vector<Sequence> seqs = {MakeSequence(700, 6, rng_), MakeSequence(40, 2, rng_)};
    const Problem p = MakeProblem(group * 2, 2, 64, seqs, rng_());
    const DeviceProblem dp(p);
    SCOPED_TRACE(::testing::Message() << "group " << group);
    ASSERT_TRUE(DecodeClose(RunGpu(p, dp, RunOptions{}), CpuReference(p), 64));
  }
}

// The split merge leaves its counters at zero: the same launch repeated gives the same bits.
TEST_F(DecodeTest, RepeatedSplitLaunchesAreDeterministic) {
  std::vector<Sequence> seqs = {MakeSequence(9000, 5, rng_)};
  const Problem p = MakeProblem(32, 8, 128, seqs, rng_());
  const DeviceProblem dp(p);
  RunOptions o;
  int used = 0;
  const std::vector<float> a = RunGpu(p, dp, o, &used);
  EXPECT_GT(used, 1);
  for (int i = 0; i < 3; ++i) {
    const std::vector<float> b = RunGpu(p, dp, o);
    ASSERT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float))) << "launch " << i;
  }
}

// A sequence with no blocks gets zeros; its neighbours are unaffected.
TEST_F(DecodeTest, EmptySequenceGivesZeros) {
  std::vector<Sequence> seqs = {MakeSequence(50, 1, rng_), MakeSequence(50, 1, rng_)};
  Problem p = MakeProblem(8, 2, 128, seqs, rng_());
  p.num_blocks[1] = 0;
  p.seqs[1].lengths = {0};
  const DeviceProblem dp(p);
  const std::vector<float> got = RunGpu(p, dp, RunOptions{});
  const std::vector<float> want = CpuReference(p);
  for (size_t i = 8 * 128; i < got.size(); ++i) ASSERT_EQ(got[i], 0.f) << i;
  EXPECT_TRUE(DecodeClose(got, want, 128));
}

TEST_F(DecodeTest, RejectsBadShapes) {
  std::vector<Sequence> seqs = {MakeSequence(20, 1, rng_)};
  const Problem p = MakeProblem(8, 2, 64, seqs, rng_());
  const DeviceProblem dp(p);
  DeviceBuffer<float> out(8 * 64);
  PagedDecodeArgs a = MakeArgs(p, dp, RunOptions{}, out.get());
  a.head_dim = 96;
  EXPECT_EQ(PagedDecodeAttention(a, Workspace(), nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  a = MakeArgs(p, dp, RunOptions{}, out.get());
  a.num_heads = 7;
  EXPECT_EQ(PagedDecodeAttention(a, Workspace(), nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  a = MakeArgs(p, dp, RunOptions{}, out.get());
  a.rope = RopeTableView{};
  EXPECT_EQ(PagedDecodeAttention(a, Workspace(), nullptr).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace lazyattn
