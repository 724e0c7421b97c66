// What the paged prefill attention tests share (paged_prefill_attention_test.cc,
// paged_prefill_kernel_agreement_test.cc): random inputs with bf16-representable values, the CPU
// twin's output, one launch of either kernel with NaN-poisoned outputs, and the tolerance.
//
// Tolerance, for every case, kernel and rotation variant: relative L2 error <= 1e-2 and every
// element within 4e-2 of the reference. Sources of difference: the kernel rounds the rotated K
// (kRotateK) or the rotated Q (kRotateQ) to bf16 once, rounds probabilities to bf16 for P V and
// writes bf16 output (|out| <= ~5 here, so output rounding alone is up to 1.6e-2).
#ifndef LAZYATTN_KERNELS_CUDA_PAGED_PREFILL_ATTENTION_TEST_UTIL_H_
#define LAZYATTN_KERNELS_CUDA_PAGED_PREFILL_ATTENTION_TEST_UTIL_H_

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/cuda/device_info.h"
#include "kernels/cuda/paged_prefill_attention.h"
#include "kernels/include/paged_attention.h"
#include "kernels/include/rope.h"

namespace lazyattn::prefill_testing {

constexpr double kMaxRelL2 = 1e-2;
constexpr double kMaxAbs = 4e-2;
constexpr int kBlock = 16;
constexpr int64_t kRopePositions = 204800;  // deltas up to 200,000 plus a 4K document

inline uint16_t ToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float FromBf16(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline float RoundBf16(float f) { return FromBf16(ToBf16(f)); }

inline bool HaveGpu() { return CudaDeviceCount() > 0; }

#define ASSERT_CUDA(call) \
  ASSERT_EQ((call), cudaSuccess) << #call << ": " << cudaGetErrorString(cudaGetLastError())

template <typename T>
struct DeviceBuffer {
  T* ptr = nullptr;
  size_t count = 0;
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t n) : count(n) {
    if (n > 0 && cudaMalloc(reinterpret_cast<void**>(&ptr), n * sizeof(T)) != cudaSuccess)
      ptr = nullptr;
  }
  ~DeviceBuffer() {
    if (ptr) cudaFree(ptr);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

// RoPE table per head dim, on the host (for the twin) and the device (for the kernel).
struct Rope {
  RopeTable table;
  std::unique_ptr<DeviceBuffer<float>> cos, sin;
};
inline const Rope& GetRope(int head_dim) {
  static std::map<int, std::unique_ptr<Rope>> cache;
  auto& slot = cache[head_dim];
  if (!slot) {
    slot = std::make_unique<Rope>();
    slot->table =
        RopeTable(RopeParams{.head_dim = head_dim, .theta = head_dim == 128 ? 500000.0 : 10000.0},
                  kRopePositions);
    const size_t n = slot->table.cos_data().size();
    slot->cos = std::make_unique<DeviceBuffer<float>>(n);
    slot->sin = std::make_unique<DeviceBuffer<float>>(n);
    cudaMemcpy(slot->cos->ptr, slot->table.cos_data().data(), n * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(slot->sin->ptr, slot->table.sin_data().data(), n * 4, cudaMemcpyHostToDevice);
  }
  return *slot;
}

// One sequence: segments (documents, then the sequence's own tokens), each starting on a fresh
// block with its own delta; the queries are the last `num_queries` tokens of the last segment.
struct SeqSpec {
  std::vector<int> seg_len;
  std::vector<uint32_t> seg_delta;
  int num_queries = 0;
};
struct CaseSpec {
  int num_heads = 0, num_kv_heads = 0, head_dim = 0;
  std::vector<SeqSpec> seqs;
};

// Host-side inputs of one case; all values already bf16-representable.
struct Inputs {
  std::vector<float> q, k_pool, v_pool;  // q: [total_queries][H][d]; pools: [blocks][KH][16][d]
  std::vector<std::vector<KvBlockEntry>> tables;
  std::vector<int64_t> q_start;
  int64_t total_queries = 0;
  int num_blocks = 0;
};

// `global_k`: store K rotated at GLOBAL positions (delta + local) and put delta 0 in the table:
// the reference "no deferred rotation" layout of the same attention.
inline Inputs MakeInputs(const CaseSpec& c, uint32_t seed, bool global_k) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  const int d = c.head_dim, KH = c.num_kv_heads, H = c.num_heads;
  const Rope& rope = GetRope(d);
  Inputs in;
  std::vector<int> blocks_per_seq;
  for (const SeqSpec& s : c.seqs) {
    int b = 0;
    for (int len : s.seg_len) b += (len + kBlock - 1) / kBlock;
    blocks_per_seq.push_back(b);
    in.num_blocks += b;
    in.q_start.push_back(in.total_queries);
    in.total_queries += s.num_queries;
  }
  const int spare = 3;  // blocks nobody references: NaN
  const int pool_blocks = in.num_blocks + spare;
  std::vector<uint32_t> physical(pool_blocks);
  std::iota(physical.begin(), physical.end(), 0u);
  std::shuffle(physical.begin(), physical.end(), rng);
  const size_t block_elems = size_t(KH) * kBlock * d;
  in.k_pool.assign(pool_blocks * block_elems, NAN);
  in.v_pool.assign(pool_blocks * block_elems, NAN);
  in.q.resize(size_t(in.total_queries) * H * d);
  for (float& x : in.q) x = RoundBf16(normal(rng));
  int next = 0;
  std::vector<float> k(d);
  for (const SeqSpec& s : c.seqs) {
    std::vector<KvBlockEntry> table;
    for (size_t g = 0; g < s.seg_len.size(); ++g) {
      const int len = s.seg_len[g];
      const uint32_t delta = s.seg_delta[g];
      for (int b0 = 0; b0 < len; b0 += kBlock) {
        const uint32_t blk = physical[next++];
        const int valid = std::min(kBlock, len - b0);
        table.push_back(PackKvBlockEntry(blk, global_k ? 0 : delta, valid));
        for (int slot = 0; slot < valid; ++slot) {
          const int local = b0 + slot;
          for (int h = 0; h < KH; ++h) {
            for (float& x : k) x = normal(rng);
            RopeRotateHeadCpu(k.data(), global_k ? int64_t{delta} + local : local, rope.table);
            const size_t off = blk * block_elems + (size_t(h) * kBlock + slot) * d;
            for (int x = 0; x < d; ++x) {
              in.k_pool[off + x] = RoundBf16(k[x]);
              in.v_pool[off + x] = RoundBf16(normal(rng));
            }
          }
        }
      }
    }
    in.tables.push_back(std::move(table));
  }
  return in;
}

inline int64_t TotalKeys(const std::vector<KvBlockEntry>& t) {
  int64_t n = 0;
  for (KvBlockEntry e : t) n += KvEntryValid(e);
  return n;
}

inline std::vector<float> CpuReference(const CaseSpec& c, const Inputs& in) {
  const int d = c.head_dim, H = c.num_heads;
  std::vector<float> out(in.q.size(), NAN);
  for (size_t s = 0; s < c.seqs.size(); ++s) {
    PagedAttentionArgs a;
    a.q = in.q.data() + in.q_start[s] * H * d;
    a.num_queries = c.seqs[s].num_queries;
    a.num_heads = H;
    a.first_query_index = TotalKeys(in.tables[s]) - a.num_queries;
    a.block_table = in.tables[s].data();
    a.num_blocks = static_cast<int>(in.tables[s].size());
    a.k_pool = in.k_pool.data();
    a.v_pool = in.v_pool.data();
    a.shape = PagedKvShape{.num_kv_heads = c.num_kv_heads, .head_dim = d, .block_size = kBlock};
    a.scale = 1.0f / std::sqrt(float(d));
    a.rope = &GetRope(d).table;
    a.out = out.data() + in.q_start[s] * H * d;
    if (a.num_queries > 0) PagedAttentionCpu(a);
  }
  return out;
}

// A kernel and, for kWgmmaWs, which of its compiled variants (PagedPrefillArgs::variant).
struct KernelRun {
  KernelRun(PrefillKernel k, int v = 0) : kernel(k), variant(v) {}  // NOLINT: implicit on purpose
  PrefillKernel kernel;
  int variant;
};

// Runs the kernel; fills `out` (bf16 results as float). Fails the test on any error. The plan
// is built for `kernel` (PrefillCtasPerSm) unless `ctas_per_sm` > 0 says otherwise.
inline void RunGpu(const CaseSpec& c, const Inputs& in, PrefillRotation rotation, KernelRun run,
                   int max_splits, std::vector<float>* out, int* work_items = nullptr,
                   int* split_groups = nullptr, int ctas_per_sm = 0) {
  const PrefillKernel kernel = run.kernel;
  const int d = c.head_dim;
  const Rope& rope = GetRope(d);
  static const int sm_count = [] {
    auto info = QueryDevice(0);
    return info.ok() ? info->sm_count : 0;
  }();
  ASSERT_GT(sm_count, 0);
  std::vector<PagedPrefillSequence> seqs(c.seqs.size());
  for (size_t s = 0; s < seqs.size(); ++s) {
    seqs[s].num_queries = c.seqs[s].num_queries;
    seqs[s].first_query_index = TotalKeys(in.tables[s]) - c.seqs[s].num_queries;
    seqs[s].block_table = in.tables[s].data();
    seqs[s].num_blocks = static_cast<int>(in.tables[s].size());
  }
  PagedPrefillShape shape{.num_heads = c.num_heads, .num_kv_heads = c.num_kv_heads, .head_dim = d};
  shape.num_pool_blocks =
      static_cast<int64_t>(in.k_pool.size() / (size_t(c.num_kv_heads) * kBlock * d));
  PagedPrefillPlan plan;
  const absl::Status built = plan.Build(
      shape, seqs.data(), static_cast<int>(seqs.size()),
      {.sm_count = sm_count,
       .rope_max_positions = kRopePositions,
       .max_splits = max_splits,
       .ctas_per_sm = ctas_per_sm > 0 ? ctas_per_sm : PrefillCtasPerSm(kernel, d, rotation)});
  ASSERT_TRUE(built.ok()) << built;
  if (work_items) *work_items = plan.num_work_items();
  if (split_groups) *split_groups = plan.num_split_groups();

  auto upload_bf16 = [](const std::vector<float>& h, DeviceBuffer<uint16_t>& dbuf) {
    std::vector<uint16_t> bits(h.size());
    for (size_t i = 0; i < h.size(); ++i) bits[i] = std::isnan(h[i]) ? 0xffff : ToBf16(h[i]);
    return cudaMemcpy(dbuf.ptr, bits.data(), bits.size() * 2, cudaMemcpyHostToDevice);
  };
  DeviceBuffer<uint16_t> q(in.q.size()), kp(in.k_pool.size()), vp(in.v_pool.size()),
      o(std::max<size_t>(in.q.size(), 1));
  DeviceBuffer<uint8_t> meta(plan.metadata_bytes()), ws(plan.workspace_bytes());
  ASSERT_CUDA(upload_bf16(in.q, q));
  ASSERT_CUDA(upload_bf16(in.k_pool, kp));
  ASSERT_CUDA(upload_bf16(in.v_pool, vp));
  ASSERT_CUDA(cudaMemset(o.ptr, 0xff, o.count * 2));  // NaN poison
  if (ws.ptr) {
    ASSERT_CUDA(cudaMemset(ws.ptr, 0xff, ws.count));
  }
  ASSERT_TRUE(plan.Upload(meta.ptr, nullptr).ok());
  PagedPrefillArgs args;
  args.q = reinterpret_cast<const __nv_bfloat16*>(q.ptr);
  args.k_pool = reinterpret_cast<const __nv_bfloat16*>(kp.ptr);
  args.v_pool = reinterpret_cast<const __nv_bfloat16*>(vp.ptr);
  args.rope_cos = rope.cos->ptr;
  args.rope_sin = rope.sin->ptr;
  args.scale = 1.0f / std::sqrt(float(d));
  args.out = reinterpret_cast<__nv_bfloat16*>(o.ptr);
  args.device_metadata = meta.ptr;
  args.workspace = ws.ptr;
  args.kernel = kernel;
  args.variant = run.variant;
  const absl::Status st = PagedPrefillAttention(plan, args, rotation, nullptr);
  ASSERT_TRUE(st.ok()) << st;
  ASSERT_CUDA(cudaDeviceSynchronize());
  std::vector<uint16_t> bits(in.q.size());
  ASSERT_CUDA(cudaMemcpy(bits.data(), o.ptr, bits.size() * 2, cudaMemcpyDeviceToHost));
  out->resize(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) (*out)[i] = FromBf16(bits[i]);
}

struct Error {
  double rel_l2 = 0, max_abs = 0;
  int64_t bad = 0, first_bad = -1;
};
inline Error Compare(const std::vector<float>& got, const std::vector<float>& ref) {
  Error e;
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double diff = double(got[i]) - ref[i];
    if (!std::isfinite(got[i]) || !(std::fabs(diff) <= kMaxAbs)) {
      if (e.bad++ == 0) e.first_bad = static_cast<int64_t>(i);
    }
    if (std::isfinite(diff)) e.max_abs = std::max(e.max_abs, std::fabs(diff));
    num += std::isfinite(diff) ? diff * diff : 1e30;
    den += double(ref[i]) * ref[i];
  }
  e.rel_l2 = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  return e;
}

inline const char* Name(PrefillRotation r) {
  switch (r) {
    case PrefillRotation::kRotateQ:
      return "rotate-q";
    case PrefillRotation::kRotateK:
      return "rotate-k";
    case PrefillRotation::kNone:
      return "none";
  }
  return "?";
}

inline std::string Name(KernelRun k) {
  switch (k.kernel) {
    case PrefillKernel::kMmaSync:
      return "mma.sync";
    case PrefillKernel::kWgmmaWs:
      return std::string("wgmma-ws/") + PrefillWgmmaWsVariantName(k.variant);
  }
  return "?";
}

// The kernels a (head dim, rotation) runs on: mma.sync always, every variant of wgmma-ws where
// it applies (asked for elsewhere it would silently run mma.sync, which would test nothing new).
inline std::vector<KernelRun> KernelsFor(int head_dim, PrefillRotation r) {
  std::vector<KernelRun> kernels = {PrefillKernel::kMmaSync};
  if (PrefillWgmmaSupports(head_dim, r)) {
    for (int v = 0; v < PrefillWgmmaWsVariants(); ++v) {
      kernels.push_back(KernelRun(PrefillKernel::kWgmmaWs, v));
    }
  }
  return kernels;
}

inline std::string Describe(const CaseSpec& c) {
  std::string s = "H=" + std::to_string(c.num_heads) + " KH=" + std::to_string(c.num_kv_heads) +
                  " d=" + std::to_string(c.head_dim) + " seqs:";
  for (const SeqSpec& q : c.seqs) {
    s += " [q=" + std::to_string(q.num_queries) + " segs=" + std::to_string(q.seg_len.size());
    int keys = 0;
    for (int l : q.seg_len) keys += l;
    s += " keys=" + std::to_string(keys) + "]";
  }
  return s;
}

// `rng` is the test's generator (TEST_SEED below): the inputs' seed is drawn from it, so the test's
// one printed seed replays every case.
inline void CheckCase(std::mt19937& rng, const CaseSpec& c,
                      const std::vector<PrefillRotation>& rotations, int max_splits = 32) {
  const uint32_t seed = rng();
  SCOPED_TRACE(Describe(c) + " seed=" + std::to_string(seed));
  const Inputs in = MakeInputs(c, seed, /*global_k=*/false);
  const std::vector<float> ref = CpuReference(c, in);
  for (PrefillRotation r : rotations) {
    for (KernelRun k : KernelsFor(c.head_dim, r)) {
      std::vector<float> got;
      int work = 0, groups = 0;
      RunGpu(c, in, r, k, max_splits, &got, &work, &groups);
      if (::testing::Test::HasFatalFailure()) return;
      const Error e = Compare(got, ref);
      std::printf("  %-16s %-8s work=%d splits=%d rel_l2=%.2e max_abs=%.2e  %s\n", Name(k).c_str(),
                  Name(r), work, groups, e.rel_l2, e.max_abs, Describe(c).c_str());
      EXPECT_LE(e.rel_l2, kMaxRelL2) << Name(k) << " " << Name(r);
      EXPECT_EQ(e.bad, 0) << Name(k) << " " << Name(r) << ": " << e.bad
                          << " elements off by more than " << kMaxAbs << ", first at "
                          << e.first_bad << " (got " << got[e.first_bad] << ", want "
                          << ref[e.first_bad] << ")";
    }
  }
}

inline const std::vector<PrefillRotation> kRotating = {PrefillRotation::kRotateQ,
                                                       PrefillRotation::kRotateK};
inline const std::vector<PrefillRotation> kAll = {
    PrefillRotation::kRotateQ, PrefillRotation::kRotateK, PrefillRotation::kNone};

// A document encoded alone: one segment at delta 0, causal.
inline SeqSpec Encoding(int len) { return SeqSpec{{len}, {0}, len}; }

// A request: `docs` documents (random lengths from `lens`, random deltas up to 200,000), then
// `own` tokens of its own at delta `own_delta`, the last `nq` of them being the queries.
inline SeqSpec Request(std::mt19937& rng, int docs, const std::vector<int>& lens, int own, int nq) {
  SeqSpec s;
  std::uniform_int_distribution<uint32_t> delta(0, 200000);
  for (int i = 0; i < docs; ++i) {
    s.seg_len.push_back(lens[rng() % lens.size()]);
    s.seg_delta.push_back(delta(rng));
  }
  s.seg_len.push_back(own);
  s.seg_delta.push_back(delta(rng));
  s.num_queries = nq;
  return s;
}

// Every random choice of a test (shapes, deltas, inputs) comes from `rng`, seeded once per test
// and printed on failure; LAZYATTN_TEST_SEED=N replays it (testing::FreshSeed).
#define TEST_SEED(rng)                                     \
  const uint32_t rng##_seed = testing::FreshSeed();        \
  SCOPED_TRACE("test seed " + std::to_string(rng##_seed)); \
  std::mt19937 rng(rng##_seed)

class PagedPrefillGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HaveGpu()) GTEST_SKIP() << "no CUDA device visible (GPU tests run via tests/gpu/run.sh)";
  }
};

}  // namespace lazyattn::prefill_testing

#endif  // LAZYATTN_KERNELS_CUDA_PAGED_PREFILL_ATTENTION_TEST_UTIL_H_
