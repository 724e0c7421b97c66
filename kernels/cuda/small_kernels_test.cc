// RMSNorm (plain and fused with the residual add), SwiGLU and the embedding gather against their
// CPU twins, on the same bf16 inputs, over odd sizes.
#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/rms_norm.h"
#include "kernels/cuda/swiglu.h"
#include "kernels/include/embedding.h"
#include "kernels/include/rms_norm.h"
#include "kernels/include/swiglu.h"

namespace lazyattn {
namespace {

using testing::Bf16BitsToFloat;
using testing::DeviceBuffer;
using testing::FloatToBf16Bits;
using testing::RoundBf16;

using testing::RandomBf16;
using testing::Bf16ToFloats;
__nv_bfloat16* Bf(DeviceBuffer<uint16_t>& b) { return reinterpret_cast<__nv_bfloat16*>(b.get()); }

// Tolerance of a kernel that computes in fp32 and rounds once to bf16: half a bf16 ulp (2^-8
// relative) plus fp32 reduction-order noise, 1e-3 of the output's RMS, per element; 5e-3
// relative L2 overall.
TEST(RmsNormCudaTest, MatchesCpuTwin) {
  SKIP_WITHOUT_GPU();
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (auto [rows, dim] : {std::pair{1, 1}, {7, 19}, {19, 99}, {3, 4096}, {64, 4096}, {2, 8191}}) {
    SCOPED_TRACE(::testing::Message() << rows << "x" << dim);
    const auto x = RandomBf16(size_t(rows) * dim, rng, 3.0f), w = RandomBf16(dim, rng);
    DeviceBuffer<uint16_t> dx, dw, dout(x.size());
    dx.Upload(x);
    dw.Upload(w);
    dout.Poison();
    ASSERT_TRUE(RmsNormCuda(Bf(dx), Bf(dw), rows, dim, 1e-5f, Bf(dout), nullptr).ok());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<float> want(x.size());
    const auto xf = Bf16ToFloats(x), wf = Bf16ToFloats(w);
    RmsNormCpu(xf.data(), wf.data(), rows, dim, 1e-5f, want.data());
    EXPECT_TRUE(testing::AllClose(Bf16ToFloats(dout.Download()), want,
                                  {1e-3 * testing::Rms(want), 1.0 / 256, 5e-3}));

    // Fused: residual += x (rounded to bf16), out = norm(residual); in place on x for out.
    const auto res = RandomBf16(x.size(), rng, 3.0f);
    DeviceBuffer<uint16_t> dres;
    dres.Upload(res);
    ASSERT_TRUE(
        FusedAddRmsNormCuda(Bf(dx), Bf(dres), Bf(dw), rows, dim, 1e-5f, Bf(dx), nullptr).ok());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<float> sum(x.size());
    const auto rf = Bf16ToFloats(res);
    for (size_t i = 0; i < sum.size(); ++i) sum[i] = RoundBf16(rf[i] + xf[i]);
    const auto got_res = Bf16ToFloats(dres.Download());
    for (size_t i = 0; i < sum.size(); ++i) ASSERT_EQ(got_res[i], sum[i]) << "residual " << i;
    RmsNormCpu(sum.data(), wf.data(), rows, dim, 1e-5f, want.data());
    EXPECT_TRUE(testing::AllClose(Bf16ToFloats(dx.Download()), want,
                                  {1e-3 * testing::Rms(want), 1.0 / 256, 5e-3}));
  }
}

// The fp32-residual forms: RMSNorm from fp32 rows, alone and fused with the residual add, and
// the embedding gather into fp32 (exact: a copy). Same tolerance as above for the norm.
TEST(RmsNormCudaTest, Fp32ResidualFormsMatchCpuTwin) {
  SKIP_WITHOUT_GPU();
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  // 576: SmolLM2's width; 4096 fills the registers exactly; 16384 runs past them (the re-read
  // loop); 19 and 8191 take the scalar path.
  for (auto [rows, dim] : {std::pair{1, 1}, {7, 19}, {2, 576}, {3, 4096}, {2, 16384}, {5, 8191}}) {
    SCOPED_TRACE(::testing::Message() << rows << "x" << dim);
    std::normal_distribution<float> normal(0, 3.0f);
    std::vector<float> x(size_t(rows) * dim);
    for (float& v : x) v = normal(rng);
    const auto w = RandomBf16(dim, rng);
    DeviceBuffer<float> dx, drows(x.size());
    DeviceBuffer<uint16_t> dw, dout(x.size());
    dx.Upload(x);
    dw.Upload(w);
    dout.Poison();
    ASSERT_TRUE(RmsNormF32ToBf16Cuda(dx.get(), Bf(dw), rows, dim, 1e-5f, Bf(dout), nullptr).ok());
    std::vector<float> want(x.size());
    const auto wf = Bf16ToFloats(w);
    RmsNormCpu(x.data(), wf.data(), rows, dim, 1e-5f, want.data());
    EXPECT_TRUE(testing::AllClose(Bf16ToFloats(dout.Download()), want,
                                  {1e-3 * testing::Rms(want), 1.0 / 256, 5e-3}));

    // The fused residual step: x += delta (exactly the fp32 sum), then the norm of the sum.
    {
      std::vector<float> delta(x.size());
      for (float& v : delta) v = normal(rng);
      DeviceBuffer<float> dres, ddelta;
      dres.Upload(x);
      ddelta.Upload(delta);
      dout.Poison();
      ASSERT_TRUE(AddRmsNormF32ToBf16Cuda(dres.get(), ddelta.get(), Bf(dw), rows, dim, 1e-5f,
                                          Bf(dout), nullptr)
                      .ok());
      std::vector<float> sum(x.size());
      for (size_t i = 0; i < x.size(); ++i) sum[i] = x[i] + delta[i];
      const auto got_sum = dres.Download();
      for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(got_sum[i], sum[i]) << "element " << i;
      std::vector<float> want_sum(x.size());
      RmsNormCpu(sum.data(), wf.data(), rows, dim, 1e-5f, want_sum.data());
      EXPECT_TRUE(testing::AllClose(Bf16ToFloats(dout.Download()), want_sum,
                                    {1e-3 * testing::Rms(want_sum), 1.0 / 256, 5e-3}));
    }

    // Rows gathered in reverse, plus an out-of-range id that must give zeros.
    std::vector<int32_t> ids(rows);
    for (int r = 0; r < rows; ++r) ids[r] = rows - 1 - r;
    ids[0] = rows == 1 ? -1 : ids[0];
    DeviceBuffer<int32_t> dids;
    dids.Upload(ids);
    // The bf16 table gathered into fp32 is exact.
    DeviceBuffer<uint16_t> dtable;
    const auto table = RandomBf16(size_t(rows) * dim, rng);
    dtable.Upload(table);
    drows.Poison();
    ASSERT_TRUE(EmbeddingGatherToF32Cuda(Bf(dtable), rows, dim, dids.get(), rows, drows.get(),
                                         nullptr).ok());
    const auto got_emb = drows.Download();
    for (int r = 0; r < rows; ++r) {
      for (int i = 0; i < dim; ++i) {
        const float expect = ids[r] < 0 ? 0.f : Bf16BitsToFloat(table[size_t(ids[r]) * dim + i]);
        ASSERT_EQ(got_emb[size_t(r) * dim + i], expect) << "row " << r << " dim " << i;
      }
    }
  }
}

TEST(SwiGluCudaTest, MatchesCpuTwin) {
  SKIP_WITHOUT_GPU();
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (auto [rows, dim] : {std::pair{1, 1}, {7, 19}, {99, 1000}, {5, 14336}}) {
    const auto gu = RandomBf16(size_t(rows) * 2 * dim, rng, 4.0f);
    DeviceBuffer<uint16_t> dgu, dout(size_t(rows) * dim);
    dgu.Upload(gu);
    dout.Poison();
    ASSERT_TRUE(SwiGluCuda(Bf(dgu), rows, dim, Bf(dout), nullptr).ok());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<float> want(size_t(rows) * dim);
    const auto gf = Bf16ToFloats(gu);
    SwiGluCpu(gf.data(), rows, dim, want.data());
    // One bf16 rounding of an fp32 value (expf differs from std::exp by a few ulp).
    EXPECT_TRUE(testing::AllClose(Bf16ToFloats(dout.Download()), want, {1e-6, 1.0 / 256 + 1e-5, 5e-3}))
        << rows << "x" << dim;
  }
}

// SwiGluCuda takes its 16-byte form only where gate_up and out are 16-byte aligned and dim % 8 ==
// 0 (swiglu.cu); a caller's buffers one element off must fall back to the one-value form with the
// same bits, not fault or read across rows.
TEST(SwiGluCudaTest, MisalignedBuffersGiveTheSameBits) {
  SKIP_WITHOUT_GPU();
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const int rows = 5, dim = 64;
  const auto gu = RandomBf16(size_t(rows) * 2 * dim, rng, 4.0f);
  std::vector<uint16_t> gu_shifted(gu.size() + 1, 0);
  std::copy(gu.begin(), gu.end(), gu_shifted.begin() + 1);
  DeviceBuffer<uint16_t> d_gu, d_gu_shifted, d_out(size_t(rows) * dim),
      d_out_shifted(size_t(rows) * dim + 1);
  d_gu.Upload(gu);
  d_gu_shifted.Upload(gu_shifted);
  d_out.Poison();
  d_out_shifted.Poison();
  ASSERT_TRUE(SwiGluCuda(Bf(d_gu), rows, dim, Bf(d_out), nullptr).ok());
  ASSERT_TRUE(SwiGluCuda(Bf(d_gu_shifted) + 1, rows, dim, Bf(d_out_shifted) + 1, nullptr).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<uint16_t> aligned = d_out.Download(), shifted = d_out_shifted.Download();
  EXPECT_EQ(shifted[0], 0xffff);  // the element before out: untouched poison
  EXPECT_EQ(aligned, std::vector<uint16_t>(shifted.begin() + 1, shifted.end()));
  EXPECT_NE(aligned[0], 0xffff);  // a value was written
}

TEST(EmbeddingCudaTest, GathersRowsAndZeroesBadIds) {
  SKIP_WITHOUT_GPU();
  const uint32_t seed = testing::FreshSeed();
  std::mt19937 rng(seed);
  for (int dim : {7, 64, 4096}) {
    const int vocab = 1000, n = 37;
    const auto table = RandomBf16(size_t(vocab) * dim, rng);
    std::uniform_int_distribution<int32_t> id(0, vocab - 1);
    std::vector<int32_t> ids(n);
    for (auto& x : ids) x = id(rng);
    ids[3] = -1;
    ids[4] = vocab;
    DeviceBuffer<uint16_t> dt, dout(size_t(n) * dim);
    DeviceBuffer<int32_t> di;
    dt.Upload(table);
    di.Upload(ids);
    dout.Poison();
    ASSERT_TRUE(EmbeddingGatherCuda(Bf(dt), vocab, dim, di.get(), n, Bf(dout), nullptr).ok());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto got = dout.Download();
    std::vector<int32_t> valid_ids = ids;
    valid_ids[3] = valid_ids[4] = 0;
    std::vector<float> want(size_t(n) * dim);
    const auto tf = Bf16ToFloats(table);
    EmbeddingGatherCpu(tf.data(), dim, valid_ids.data(), n, want.data());
    for (int t = 0; t < n; ++t) {
      for (int x = 0; x < dim; ++x) {
        const float g = Bf16BitsToFloat(got[size_t(t) * dim + x]);
        ASSERT_EQ(g, (t == 3 || t == 4) ? 0.f : want[size_t(t) * dim + x]) << t << "," << x;
      }
    }
  }
}

}  // namespace
}  // namespace lazyattn
