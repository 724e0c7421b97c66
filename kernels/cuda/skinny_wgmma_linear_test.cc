#include "kernels/cuda/skinny_wgmma_linear.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <tuple>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/cuda/rope_table_cuda.h"
#include "kernels/include/gemm.h"
#include "kernels/include/rope.h"
#include "kernels/include/swiglu.h"

namespace lazyattn {
namespace {

using testing::AsBf16;
using testing::AsMutableBf16;
using testing::Bf16ToFloats;
using testing::DeviceBuffer;
using testing::FloatToBf16Bits;
using testing::RandomBf16;

struct Case {
  int rows, in, out;
  bool fp32, accumulate;
  SkinnyWgmmaConfig config;  // zeros: the kernel's choice
};

// Elements after y that must come back untouched (they hold a sentinel, or poison when y is).
constexpr size_t kGuard = 256;

// Runs one product on fresh random inputs and returns y; `want` gets LinearCpu's answer.
void RunProduct(const Case& c, std::mt19937& rng, std::vector<float>* got, std::vector<float>* want,
         const SkinnyWgmmaWorkspace& ws) {
  const auto x = RandomBf16(size_t(c.rows) * c.in, rng);
  const auto w = RandomBf16(size_t(c.out) * c.in, rng);
  const size_t n = size_t(c.rows) * c.out;
  std::vector<float> y0(n);
  for (auto& v : y0) v = testing::RoundBf16(std::normal_distribution<float>(0, 10)(rng));
  DeviceBuffer<uint16_t> dx, dw, dy16;
  DeviceBuffer<float> dy32;
  dx.Upload(x);
  dw.Upload(w);
  if (c.fp32) {
    std::vector<float> padded = y0;
    padded.resize(n + kGuard, 12345.f);
    dy32.Upload(padded);
    if (!c.accumulate) dy32.Poison();
  } else {
    std::vector<uint16_t> bits(n + kGuard, 0x4640);  // bf16 12288
    for (size_t i = 0; i < n; ++i) bits[i] = FloatToBf16Bits(y0[i]);
    dy16.Upload(bits);
    if (!c.accumulate) dy16.Poison();
  }
  const std::vector<float> guard_before = c.fp32 ? dy32.Download() : Bf16ToFloats(dy16.Download());
  void* y = c.fp32 ? static_cast<void*>(dy32.get()) : static_cast<void*>(dy16.get());
  const absl::Status st = SkinnyWgmmaLinearCuda(
      AsBf16(dx), AsBf16(dw), c.rows, c.in, c.out, y,
      c.fp32 ? GemmOutputType::kFp32 : GemmOutputType::kBf16, c.accumulate, ws, nullptr,
      c.config);
  ASSERT_TRUE(st.ok()) << st;
  CUDA_ASSERT(cudaDeviceSynchronize());
  *want = y0;
  const auto xf = Bf16ToFloats(x), wf = Bf16ToFloats(w);
  LinearCpu(xf.data(), wf.data(), c.rows, c.in, c.out, want->data(), c.accumulate);
  *got = c.fp32 ? dy32.Download() : Bf16ToFloats(dy16.Download());
  // Nothing past y was written (compared as bits: the poison is NaN).
  EXPECT_EQ(0, std::memcmp(got->data() + n, guard_before.data() + n, kGuard * sizeof(float)));
  got->resize(n);
  if (c.config.tile_features != 0 && c.config.splits != 0) {
    const SkinnyWgmmaConfig used = SkinnyWgmmaChosenConfig(c.rows, c.in, c.out, c.config);
    EXPECT_EQ(used.tile_features, c.config.tile_features);
    EXPECT_EQ(used.splits, c.config.splits);  // the cases ask only for cuts the kernel can make
  }
}

// The GPU cases: a compute capability 9.0 device, an initialized workspace and a fresh seed.
class SkinnyWgmmaLinearGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_GPU();
    if (!SkinnyWgmmaLinearSupports(1, 64, 1, nullptr, nullptr, nullptr)) {
      GTEST_SKIP() << "needs a compute capability 9.0 device";
    }
    ASSERT_TRUE(ws_.Init().ok());
    seed_ = testing::FreshSeed();
    rng_.seed(seed_);
  }
  SkinnyWgmmaWorkspace ws_;
  uint32_t seed_ = 0;
  std::mt19937 rng_;
};

// Against LinearCpu on the same bf16 inputs, with the tolerances of gemm_test.cc: fp32 sums in
// another order (~1e-6 relative), and a bf16 output adds half an ulp (with accumulate, the
// rounded sum of two values). Rows cover each row tile (8, 16, 32, 64) full and partial; out
// covers partial tiles of each width (64, 128, 256 features); in a partial 64-element K block,
// also split; splits 1 to 8 (8 over 33 K blocks: uneven splits), into fp32 and bf16 outputs;
// one K block (in 64: a single stage, which the 64-row tile's delayed release must handle).
TEST_F(SkinnyWgmmaLinearGpuTest, MatchesCpuTwin) {
  SCOPED_TRACE(::testing::Message() << "seed " << seed_);
  std::vector<Case> cases;
  for (int rows : {1, 7, 8, 13, 16, 32, 33, 64}) {
    cases.push_back({rows, 576, 99, true, false, {64, 1}});
    cases.push_back({rows, 4096, 4096, true, true, {}});
    cases.push_back({rows, 4104, 200, false, false, {64, 1}});
    cases.push_back({rows, 1024, 128, false, true, {128, 1}});
    cases.push_back({rows, 14336, 256, true, false, {64, 3}});
    cases.push_back({rows, 2048, 1000, false, true, {128, 3}});
    cases.push_back({rows, 4096, 300, true, true, {256, 8}});
    cases.push_back({rows, 1088, 6144, false, false, {256, 2}});
    cases.push_back({rows, 2112, 200, true, true, {64, 8}});
    cases.push_back({rows, 4104, 520, true, false, {64, 3}});
    cases.push_back({rows, 64, 99, true, true, {64, 1}});
  }
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << c.rows << "x" << c.in << " * " << c.out << " fp32 "
                                      << c.fp32 << " accumulate " << c.accumulate << " tile "
                                      << c.config.tile_features << " splits "
                                      << c.config.splits);
    std::vector<float> got, want;
    RunProduct(c, rng_, &got, &want, ws_);
    if (::testing::Test::HasFatalFailure()) return;
    const double rms = testing::Rms(want);
    EXPECT_TRUE(testing::AllClose(got, want,
                                  c.fp32 ? testing::Tolerance{1e-4 * rms, 1e-4, 1e-4}
                                         : testing::Tolerance{1e-2 * rms, 1.0 / 128, 5e-3}));
  }
}

// Split K adds the splits in a fixed order: the same inputs give the same bits every time,
// whichever split happens to finish last.
TEST_F(SkinnyWgmmaLinearGpuTest, SplitKIsDeterministic) {
  SCOPED_TRACE(::testing::Message() << "seed " << seed_);
  const int rows = 32, in = 14336, out = 4096;
  const auto x = RandomBf16(size_t(rows) * in, rng_);
  const auto w = RandomBf16(size_t(out) * in, rng_);
  DeviceBuffer<uint16_t> dx, dw;
  DeviceBuffer<float> dy(size_t(rows) * out);
  dx.Upload(x);
  dw.Upload(w);
  std::vector<float> first;
  for (int run = 0; run < 5; ++run) {
    dy.Poison();
    ASSERT_TRUE(SkinnyWgmmaLinearCuda(AsBf16(dx), AsBf16(dw), rows, in, out, dy.get(),
                                      GemmOutputType::kFp32, false, ws_, nullptr, {128, 4})
                    .ok());
    CUDA_ASSERT(cudaDeviceSynchronize());
    const std::vector<float> y = dy.Download();
    if (run == 0) {
      first = y;
    } else {
      EXPECT_EQ(0, std::memcmp(first.data(), y.data(), y.size() * sizeof(float))) << run;
    }
  }
}

// Calls queued back to back (launched overlapped, no host synchronization between them) each
// add x W^T into y: the next call's weight loads start before the previous call ends, and the
// split-K workspace is reused call after call.
TEST_F(SkinnyWgmmaLinearGpuTest, BackToBackCallsAccumulate) {
  SCOPED_TRACE(::testing::Message() << "seed " << seed_);
  const int rows = 32, in = 4096, out = 1024, calls = 6;
  const auto x = RandomBf16(size_t(rows) * in, rng_);
  const auto w = RandomBf16(size_t(out) * in, rng_);
  std::vector<float> want(size_t(rows) * out);
  for (auto& v : want) v = std::normal_distribution<float>(0, 10)(rng_);
  DeviceBuffer<uint16_t> dx, dw;
  DeviceBuffer<float> dy;
  dx.Upload(x);
  dw.Upload(w);
  dy.Upload(want);
  cudaStream_t stream;
  CUDA_ASSERT(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  for (int i = 0; i < calls; ++i) {
    ASSERT_TRUE(SkinnyWgmmaLinearCuda(AsBf16(dx), AsBf16(dw), rows, in, out, dy.get(),
                                      GemmOutputType::kFp32, true, ws_, stream, {64, 4})
                    .ok());
  }
  CUDA_ASSERT(cudaStreamSynchronize(stream));
  CUDA_ASSERT(cudaStreamDestroy(stream));
  const auto xf = Bf16ToFloats(x), wf = Bf16ToFloats(w);
  for (int i = 0; i < calls; ++i) LinearCpu(xf.data(), wf.data(), rows, in, out, want.data(), true);
  const std::vector<float> got = dy.Download();
  const double rms = testing::Rms(want);
  EXPECT_TRUE(testing::AllClose(got, want, testing::Tolerance{1e-4 * rms, 1e-4, 1e-4}));
}

// The SwiGLU form against LinearCpu + SwiGluCpu on the same bf16 inputs, gate and up rounded to
// bf16 on both sides: fp32 sums ~1e-6 relative apart may round to neighbouring bf16 values (an
// ulp, up to 2^-7 relative, in gate or up), then the product is rounded once more (2^-9):
// 3/256 relative. inter covers partial 64- and 128-feature tiles (200: 8 features past the
// last 64; 136 and 320: 64 past the last 128, so that tile's gate and up halves are half
// empty); tiles of 64 and 128 features; splits the kernel's choice, 3 (uneven) and 8.
TEST_F(SkinnyWgmmaLinearGpuTest, SwiGluMatchesCpuTwin) {
  SCOPED_TRACE(::testing::Message() << "seed " << seed_);
  struct SwiGluCase {
    int rows, in, inter, features, splits;
  };
  std::vector<SwiGluCase> cases;
  for (int rows : {1, 8, 17, 32, 64}) {
    for (int features : {0, 128}) {
      cases.push_back({rows, 4096, 1024, features, 0});
      cases.push_back({rows, 576, 200, features, 3});
      cases.push_back({rows, 2112, 136, features, 8});
    }
    cases.push_back({rows, 1088, 320, 128, 0});
  }
  for (const SwiGluCase& c : cases) {
    SCOPED_TRACE(::testing::Message() << c.rows << "x" << c.in << " inter " << c.inter
                                      << " features " << c.features << " splits " << c.splits);
    const auto x = RandomBf16(size_t(c.rows) * c.in, rng_);
    const auto w = RandomBf16(size_t(2 * c.inter) * c.in, rng_);
    const size_t n = size_t(c.rows) * c.inter;
    DeviceBuffer<uint16_t> dx, dw, dact;
    dx.Upload(x);
    dw.Upload(w);
    std::vector<uint16_t> act_bits(n + kGuard, 0x4640);  // bf16 12288 past act
    std::fill_n(act_bits.begin(), n, 0xffff);               // NaN poison in act
    dact.Upload(act_bits);
    auto* act = AsMutableBf16(dact);
    ASSERT_TRUE(SkinnyWgmmaLinearSwiGluCuda(AsBf16(dx), AsBf16(dw), c.rows, c.in, c.inter, act,
                                            ws_, nullptr,
                                            {.tile_features = c.features, .splits = c.splits})
                    .ok());
    CUDA_ASSERT(cudaDeviceSynchronize());
    const auto xf = Bf16ToFloats(x), wf = Bf16ToFloats(w);
    std::vector<float> gate_up(size_t(c.rows) * 2 * c.inter), want(n);
    LinearCpu(xf.data(), wf.data(), c.rows, c.in, 2 * c.inter, gate_up.data(), false);
    for (float& v : gate_up) v = testing::RoundBf16(v);  // the kernel rounds gate and up
    SwiGluCpu(gate_up.data(), c.rows, c.inter, want.data());
    std::vector<float> got = Bf16ToFloats(dact.Download());
    for (size_t i = n; i < n + kGuard; ++i) ASSERT_EQ(got[i], 12288.f) << "written past act";
    got.resize(n);
    EXPECT_TRUE(testing::AllClose(got, want,
                                  testing::Tolerance{1e-2 * testing::Rms(want), 3.0 / 256, 5e-3}));
  }
}

// The QKV + RoPE form against its definition: the same product written to a bf16 qkv by
// SkinnyWgmmaLinearCuda with the same cut (so the same fp32 sums), then RopeKvAppend (itself
// tested against the CPU twins). Both round each qkv value to bf16 and rotate it in fp32 with
// the same cos/sin. Two compilations could contract a*c - b*s into an FMA differently (both
// compile to the same instructions today), which near a cancellation moves the fp32 result by an
// ulp of the products and then its bf16 rounding: |got - want| <= 2^-7 |want| + 2^-20 max|want|.
// Every other pool element must be untouched, and a negative slot writes nothing. GQA 4/2 and
// 8/8 heads, rows from 1 to 64, positions up to 200,000 and past the table's end (clamped to its
// last row), splits 1 and 3 (17 K blocks: uneven).
TEST_F(SkinnyWgmmaLinearGpuTest, QkvRopeMatchesGemmThenRopeKvAppend) {
  SCOPED_TRACE(::testing::Message() << "seed " << seed_);
  constexpr int kHeadDim = 128, kPoolBlocks = 9;
  RopeTable table(RopeParams{.head_dim = kHeadDim, .theta = 500000}, 220000);
  auto rope = DeviceRopeTable::Create(table);
  ASSERT_TRUE(rope.ok()) << rope.status();
  struct QkvCase {
    int rows, in, heads, kv_heads, splits;
  };
  for (const QkvCase c : {QkvCase{1, 576, 4, 2, 1}, QkvCase{7, 1088, 4, 2, 3},
                          QkvCase{32, 1024, 8, 8, 0}, QkvCase{33, 576, 4, 2, 1},
                          QkvCase{64, 2112, 4, 2, 3}}) {
    SCOPED_TRACE(::testing::Message() << c.rows << "x" << c.in << " heads " << c.heads << "/"
                                      << c.kv_heads << " splits " << c.splits);
    const int out = (c.heads + 2 * c.kv_heads) * kHeadDim;
    const auto x = RandomBf16(size_t(c.rows) * c.in, rng_);
    const auto w = RandomBf16(size_t(out) * c.in, rng_);
    std::vector<int32_t> local(c.rows), delta(c.rows);
    std::vector<int64_t> slots(c.rows);
    std::vector<int64_t> free_slots(kPoolBlocks * 16);
    for (size_t i = 0; i < free_slots.size(); ++i) free_slots[i] = int64_t(i);
    std::shuffle(free_slots.begin(), free_slots.end(), rng_);
    std::uniform_int_distribution<int> pos(0, 20000), off(0, 180000);
    for (int r = 0; r < c.rows; ++r) {
      local[r] = pos(rng_);
      delta[r] = off(rng_);
      if (r % 5 == 3) {
        local[r] = 225000;  // k and q past the table's 220,000 rows
      } else if (r % 7 == 2) {
        delta[r] = 219998 - local[r] + r % 4;  // q from its second-last row to past the end
      }
      slots[r] = r == c.rows / 2 && c.rows > 1 ? -1 : free_slots[r];  // one padding row
    }
    DeviceBuffer<uint16_t> dx, dw;
    dx.Upload(x);
    dw.Upload(w);
    DeviceBuffer<int32_t> d_local, d_delta;
    DeviceBuffer<int64_t> d_slots;
    d_local.Upload(local);
    d_delta.Upload(delta);
    d_slots.Upload(slots);
    const size_t pool = size_t(kPoolBlocks) * c.kv_heads * 16 * kHeadDim;
    // [0]: the fused form, [1]: GEMM + RopeKvAppend; pools start as the same sentinel.
    DeviceBuffer<uint16_t> q_out[2], k_pool[2], v_pool[2];
    for (int v = 0; v < 2; ++v) {
      q_out[v].Upload(std::vector<uint16_t>(size_t(c.rows) * c.heads * kHeadDim, 0x4640));
      k_pool[v].Upload(std::vector<uint16_t>(pool, 0x4640));
      v_pool[v].Upload(std::vector<uint16_t>(pool, 0x4640));
    }
    DeviceBuffer<uint16_t> qkv(size_t(c.rows) * out);
    auto args = [&](int v) {
      return RopeKvAppendArgs{.q = AsBf16(qkv),
                              .q_row_stride = out,
                              .k = AsBf16(qkv) + c.heads * kHeadDim,
                              .k_row_stride = out,
                              .v = AsBf16(qkv) + (c.heads + c.kv_heads) * kHeadDim,
                              .v_row_stride = out,
                              .num_tokens = c.rows,
                              .num_heads = c.heads,
                              .num_kv_heads = c.kv_heads,
                              .head_dim = kHeadDim,
                              .local_positions = d_local.get(),
                              .deltas = d_delta.get(),
                              .slots = d_slots.get(),
                              .rope = (*rope)->view(),
                              .q_out = AsMutableBf16(q_out[v]),
                              .k_pool = AsMutableBf16(k_pool[v]),
                              .v_pool = AsMutableBf16(v_pool[v])};
    };
    const SkinnyWgmmaConfig cut{.tile_features = 128, .splits = c.splits};
    ASSERT_TRUE(SkinnyWgmmaQkvRopeSupports(c.rows, c.in, args(0), dx.get(), dw.get()));
    ASSERT_TRUE(
        SkinnyWgmmaLinearQkvRopeCuda(AsBf16(dx), AsBf16(dw), c.rows, c.in, args(0), ws_, nullptr,
                                     cut)
            .ok());
    ASSERT_TRUE(SkinnyWgmmaLinearCuda(AsBf16(dx), AsBf16(dw), c.rows, c.in, out, qkv.get(),
                                      GemmOutputType::kBf16, false, ws_, nullptr, cut)
                    .ok());
    ASSERT_TRUE(RopeKvAppend(args(1), nullptr).ok());
    CUDA_ASSERT(cudaDeviceSynchronize());
    for (auto [name, got, want] :
         {std::tuple{"q_out", &q_out[0], &q_out[1]}, std::tuple{"k_pool", &k_pool[0], &k_pool[1]},
          std::tuple{"v_pool", &v_pool[0], &v_pool[1]}}) {
      SCOPED_TRACE(name);
      const std::vector<float> want_values = Bf16ToFloats(want->Download());
      double max_abs = 0;
      for (float v : want_values) max_abs = std::max(max_abs, double(std::fabs(v)));
      EXPECT_TRUE(testing::AllClose(Bf16ToFloats(got->Download()), want_values,
                                    testing::Tolerance{std::ldexp(max_abs, -20), 1.0 / 128, 1e-3}));
    }
  }
}

// Packed weights (PackWeightsForWgmma) hold the same values in the order the kernel's shared
// memory wants, so every form must give the same bits from them as from the tensor map: every
// row tile, partial 64-row groups and K blocks, each tile width, split and unsplit, the SwiGLU
// and QKV forms. Also refused: packed gate/up with inter not a multiple of 64.
TEST_F(SkinnyWgmmaLinearGpuTest, PackedWeightsGiveTheSameBits) {
  SCOPED_TRACE(::testing::Message() << "seed " << seed_);
  // Packs w on the GPU and checks every element of the result (padding included) against the
  // layout computed here: block (g, kb) at (g * k_blocks + kb) * 4096, row r of 64, smem slot j
  // holding column 8 * ((j / 8) ^ (r % 8)) + j % 8 of the block (TMA's 128-byte swizzle).
  auto packed_of = [](const DeviceBuffer<uint16_t>& w, int64_t out, int64_t in) {
    auto p = std::make_unique<DeviceBuffer<uint16_t>>(PackedWeightsElements(out, in));
    p->Poison();
    EXPECT_TRUE(PackWeightsForWgmma(AsBf16(w), out, in,
                                    AsMutableBf16(*p), nullptr)
                    .ok());
    const std::vector<uint16_t> host_w = w.Download(), got = p->Download();
    const int64_t k_blocks = (in + 63) / 64;
    EXPECT_EQ(int64_t(got.size()) % (k_blocks * 4096), 0);
    size_t wrong = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const int64_t block = int64_t(i) / 4096, r = int64_t(i) % 4096 / 64, j = int64_t(i) % 64;
      const int64_t n = block / k_blocks * 64 + r;
      const int64_t k = block % k_blocks * 64 + 8 * ((j / 8) ^ (r % 8)) + j % 8;
      const uint16_t want = n < out && k < in ? host_w[n * in + k] : 0;
      wrong += got[i] != want;
    }
    EXPECT_EQ(wrong, 0u) << "of " << got.size() << " packed elements";
    return p;
  };
  struct PlainCase {
    int rows, in, out;
    SkinnyWgmmaConfig cut;
  };
  for (const PlainCase c :
       {PlainCase{1, 576, 99, {64, 1}}, PlainCase{8, 4104, 200, {128, 3}},
        PlainCase{12, 1024, 4096, {128, 0}},
        PlainCase{32, 1088, 300, {256, 2}}, PlainCase{33, 4096, 6144, {}},
        PlainCase{64, 2112, 520, {64, 4}}}) {
    SCOPED_TRACE(::testing::Message() << c.rows << "x" << c.in << " * " << c.out << " tile "
                                      << c.cut.tile_features << " splits " << c.cut.splits);
    DeviceBuffer<uint16_t> x, w;
    x.Upload(RandomBf16(size_t(c.rows) * c.in, rng_));
    w.Upload(RandomBf16(size_t(c.out) * c.in, rng_));
    auto packed = packed_of(w, c.out, c.in);
    DeviceBuffer<float> y[2];
    for (int v = 0; v < 2; ++v) {
      y[v].Resize(size_t(c.rows) * c.out);
      y[v].Poison();
      ASSERT_TRUE(SkinnyWgmmaLinearCuda(
                      AsBf16(x), AsBf16(w), c.rows, c.in, c.out, y[v].get(),
                      GemmOutputType::kFp32, false, ws_, nullptr, c.cut,
                      v == 1 ? AsBf16(*packed) : nullptr)
                      .ok());
    }
    CUDA_ASSERT(cudaDeviceSynchronize());
    const std::vector<float> a = y[0].Download(), b = y[1].Download();
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
    EXPECT_TRUE(std::all_of(a.begin(), a.end(), [](float v) { return std::isfinite(v); }));
  }
  // The SwiGLU form: inter 192 (3 tiles of 64 features; 2 of 128, the last half empty, its
  // up block reading the packed copy's padding) and 1024, split and not.
  for (const auto& [rows, in, inter, features, splits] :
       {std::tuple{17, 576, 192, 0, 0}, std::tuple{32, 1088, 1024, 64, 3},
        std::tuple{64, 576, 192, 128, 0}, std::tuple{32, 1088, 1024, 128, 2}}) {
    SCOPED_TRACE(::testing::Message() << "SwiGLU " << rows << "x" << in << " inter " << inter
                                      << " features " << features);
    DeviceBuffer<uint16_t> x, w, act[2];
    x.Upload(RandomBf16(size_t(rows) * in, rng_));
    w.Upload(RandomBf16(size_t(2 * inter) * in, rng_));
    auto packed = packed_of(w, 2 * inter, in);
    for (int v = 0; v < 2; ++v) {
      act[v].Resize(size_t(rows) * inter);
      act[v].Poison();
      ASSERT_TRUE(SkinnyWgmmaLinearSwiGluCuda(
                      AsBf16(x), AsBf16(w), rows, in, inter,
                      AsMutableBf16(act[v]), ws_, nullptr,
                      {.tile_features = features, .splits = splits},
                      v == 1 ? AsBf16(*packed) : nullptr)
                      .ok());
    }
    CUDA_ASSERT(cudaDeviceSynchronize());
    EXPECT_EQ(act[0].Download(), act[1].Download());
  }
  // The QKV form: 4/2 heads of 128, 7 rows.
  {
    constexpr int kRows = 7, kIn = 576, kHeads = 4, kKvHeads = 2, kPoolBlocks = 2;
    const int out = (kHeads + 2 * kKvHeads) * 128;
    RopeTable table(RopeParams{.head_dim = 128, .theta = 500000}, 4096);
    auto rope = DeviceRopeTable::Create(table);
    ASSERT_TRUE(rope.ok()) << rope.status();
    DeviceBuffer<uint16_t> x, w;
    x.Upload(RandomBf16(size_t(kRows) * kIn, rng_));
    w.Upload(RandomBf16(size_t(out) * kIn, rng_));
    auto packed = packed_of(w, out, kIn);
    DeviceBuffer<int32_t> local, delta;
    DeviceBuffer<int64_t> slots;
    local.Upload({3, 70, 900, 4000, 5, 6, 1});
    delta.Upload({0, 10, 2000, 90, 0, 7, 3000});
    slots.Upload({0, 1, 2, -1, 17, 30, 31});
    const size_t pool = size_t(kPoolBlocks) * kKvHeads * 16 * 128;
    DeviceBuffer<uint16_t> q_out[2], k_pool[2], v_pool[2];
    for (int v = 0; v < 2; ++v) {
      q_out[v].Upload(std::vector<uint16_t>(size_t(kRows) * kHeads * 128, 0x4640));
      k_pool[v].Upload(std::vector<uint16_t>(pool, 0x4640));
      v_pool[v].Upload(std::vector<uint16_t>(pool, 0x4640));
      const RopeKvAppendArgs args{.num_tokens = kRows,
                                  .num_heads = kHeads,
                                  .num_kv_heads = kKvHeads,
                                  .head_dim = 128,
                                  .local_positions = local.get(),
                                  .deltas = delta.get(),
                                  .slots = slots.get(),
                                  .rope = (*rope)->view(),
                                  .q_out = AsMutableBf16(q_out[v]),
                                  .k_pool = AsMutableBf16(k_pool[v]),
                                  .v_pool = AsMutableBf16(v_pool[v])};
      ASSERT_TRUE(SkinnyWgmmaLinearQkvRopeCuda(
                      AsBf16(x), AsBf16(w), kRows, kIn, args, ws_, nullptr, {},
                      v == 1 ? AsBf16(*packed) : nullptr)
                      .ok());
    }
    CUDA_ASSERT(cudaDeviceSynchronize());
    EXPECT_EQ(q_out[0].Download(), q_out[1].Download());
    EXPECT_EQ(k_pool[0].Download(), k_pool[1].Download());
    EXPECT_EQ(v_pool[0].Download(), v_pool[1].Download());
  }
  // Packed gate/up rows must start at a 64-row group: inter 200 is refused.
  DeviceBuffer<uint16_t> x(8 * 576), w(400 * 576), act(8 * 200);
  auto packed = packed_of(w, 400, 576);
  EXPECT_EQ(SkinnyWgmmaLinearSwiGluCuda(AsBf16(x), AsBf16(w), 8, 576, 200,
                                        AsMutableBf16(act), ws_, nullptr, {},
                                        AsBf16(*packed))
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(SkinnyWgmmaLinearTest, RefusesWhatItCannotDo) {
  SkinnyWgmmaWorkspace ws;  // not initialized: no split may run
  EXPECT_FALSE(SkinnyWgmmaLinearSupports(65, 4096, 64, nullptr, nullptr, nullptr));
  EXPECT_FALSE(SkinnyWgmmaLinearSupports(1, 4100, 64, nullptr, nullptr, nullptr));
  EXPECT_FALSE(SkinnyWgmmaLinearSupports(1, 32, 64, nullptr, nullptr, nullptr));
  EXPECT_FALSE(SkinnyWgmmaLinearSupports(1, 4096, int64_t{1} << 38, nullptr, nullptr, nullptr));
  EXPECT_EQ(SkinnyWgmmaLinearCuda(nullptr, nullptr, 0, 4096, 64, nullptr, GemmOutputType::kFp32,
                                  false, ws, nullptr)
                .code(),
            absl::StatusCode::kInvalidArgument);
  if (!SkinnyWgmmaLinearSupports(1, 64, 1, nullptr, nullptr, nullptr)) return;  // needs sm_90
  DeviceBuffer<uint16_t> x(64 * 1024), w(64 * 1024);
  DeviceBuffer<float> y(64 * 64);
  for (const SkinnyWgmmaConfig bad : {SkinnyWgmmaConfig{96, 1}, SkinnyWgmmaConfig{64, 9},
                                      SkinnyWgmmaConfig{64, -1}}) {
    EXPECT_EQ(SkinnyWgmmaLinearCuda(AsBf16(x), AsBf16(w), 64, 1024, 64, y.get(),
                                    GemmOutputType::kFp32, false, ws, nullptr, bad)
                  .code(),
              absl::StatusCode::kInvalidArgument);
  }
  // The SwiGLU form's tiles are 64 or 128 features (w: 2 x 32 rows of 1024).
  for (const int features : {32, 256}) {
    EXPECT_EQ(SkinnyWgmmaLinearSwiGluCuda(AsBf16(x), AsBf16(w), 64, 1024, 32,
                                          reinterpret_cast<__nv_bfloat16*>(y.get()), ws, nullptr,
                                          {.tile_features = features})
                  .code(),
              absl::StatusCode::kInvalidArgument);
  }
  // Split K without an initialized workspace is refused, not run; the kernel's own choice then
  // does not split.
  EXPECT_EQ(SkinnyWgmmaLinearCuda(AsBf16(x), AsBf16(w), 64, 1024, 64, y.get(),
                                  GemmOutputType::kFp32, false, ws, nullptr, {64, 2})
                .code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(SkinnyWgmmaLinearCuda(AsBf16(x), AsBf16(w), 64, 1024, 64, y.get(),
                                    GemmOutputType::kFp32, false, ws, nullptr)
                  .ok());
  CUDA_ASSERT(cudaDeviceSynchronize());
}

}  // namespace
}  // namespace lazyattn
