#include <atomic>
#include <cmath>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/include/cpu_threads.h"
#include "kernels/include/quant_linear.h"

namespace lazyattn {
namespace {

// Float to IEEE half bits for normal values (round to nearest), enough for test scales.
uint16_t ToHalf(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  const uint32_t sign = (b >> 16) & 0x8000;
  const int exp = static_cast<int>((b >> 23) & 0xFF) - 127 + 15;
  if (exp <= 0) return static_cast<uint16_t>(sign);  // below half's normal range: zero
  const uint32_t mant = (b >> 13) & 0x3FF;
  return static_cast<uint16_t>(sign | (static_cast<uint32_t>(exp) << 10) | mant);
}
double FromHalf(uint16_t h) {  // zero and normal values only (what ToHalf makes)
  if ((h & 0x7FFF) == 0) return 0;
  const double m = 1.0 + (h & 0x3FF) / 1024.0;
  const double v = std::ldexp(m, ((h >> 10) & 0x1F) - 15);
  return (h & 0x8000) ? -v : v;
}

struct Matrix {
  WeightType type;
  int64_t rows, cols;
  std::vector<uint8_t> bytes;
  std::vector<double> values;  // what the bytes mean, computed here independently of the kernels
  QuantMatrixView view() const { return {type, bytes.data(), rows, cols}; }
};

void Put16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, 2); }

Matrix Random(WeightType type, int64_t rows, int64_t cols, std::mt19937& rng) {
  Matrix m{type, rows, cols, std::vector<uint8_t>(WeightTypeRowBytes(type, cols) * rows),
           std::vector<double>(rows * cols)};
  std::uniform_real_distribution<float> uni(-1, 1), scale(0.002f, 0.05f);
  std::uniform_int_distribution<int> byte(0, 255);
  uint8_t* p = m.bytes.data();
  double* v = m.values.data();
  for (int64_t i = 0;
       i < rows * (type == WeightType::kF32 || type == WeightType::kF16 || type == WeightType::kBF16
                       ? cols
                       : cols / 32);
       ++i) {
    switch (type) {
      case WeightType::kF32: {
        const float f = uni(rng);
        std::memcpy(p, &f, 4);
        p += 4;
        *v++ = f;
        break;
      }
      case WeightType::kF16: {
        const uint16_t h = ToHalf(uni(rng));
        Put16(p, h);
        p += 2;
        *v++ = FromHalf(h);
        break;
      }
      case WeightType::kBF16: {
        const float f = uni(rng);
        uint32_t b;
        std::memcpy(&b, &f, 4);
        Put16(p, static_cast<uint16_t>(b >> 16));
        p += 2;
        const uint32_t back = b & 0xFFFF0000u;
        float g;
        std::memcpy(&g, &back, 4);
        *v++ = g;
        break;
      }
      case WeightType::kQ8_0: {
        const uint16_t d = ToHalf(scale(rng));
        Put16(p, d);
        for (int j = 0; j < 32; ++j) {
          p[2 + j] = static_cast<uint8_t>(byte(rng));
          *v++ = FromHalf(d) * static_cast<int8_t>(p[2 + j]);
        }
        p += 34;
        break;
      }
      case WeightType::kQ4_0:
      case WeightType::kQ4_1: {
        const bool q41 = type == WeightType::kQ4_1;
        const uint16_t d = ToHalf(scale(rng)), mn = ToHalf(-scale(rng) * 8);
        Put16(p, d);
        if (q41) Put16(p + 2, mn);
        uint8_t* qs = p + (q41 ? 4 : 2);
        for (int j = 0; j < 16; ++j) qs[j] = static_cast<uint8_t>(byte(rng));
        for (int j = 0; j < 32; ++j) {
          const int q = j < 16 ? (qs[j] & 0xF) : (qs[j - 16] >> 4);
          *v++ = q41 ? FromHalf(d) * q + FromHalf(mn) : FromHalf(d) * (q - 8);
        }
        p += q41 ? 20 : 18;
        break;
      }
    }
  }
  return m;
}

class QuantLinearTest : public ::testing::TestWithParam<WeightType> {};

// Every type, both paths (few rows: fused dots with fp32 activations; many: dequantized tiles
// and OpenBLAS), every kernel variant this CPU runs, odd sizes, with and without accumulation, against a double
// reference computed from the values the test itself encoded.
TEST_P(QuantLinearTest, MatchesScalarReference) {
  const WeightType type = GetParam();
  const bool blocked = WeightTypeBlockValues(type) > 1;
  std::mt19937 rng(7);
  std::vector<CpuIsa> isas = {CpuIsa::kPortable, CpuIsa::kAuto};
  if (CpuSupportsIsa(CpuIsa::kAvx2)) isas.push_back(CpuIsa::kAvx2);
  for (const int64_t cols :
       blocked ? std::vector<int64_t>{32, 96, 576} : std::vector<int64_t>{1, 7, 8, 23, 37, 576}) {
    for (const int64_t out : {1, 5, 17, 131}) {
      for (const int64_t rows : {1, 3, 8, 9, 21}) {
        const Matrix w = Random(type, out, cols, rng);
        std::uniform_real_distribution<float> uni(-2, 2);
        std::vector<float> x(rows * cols);
        for (float& f : x) f = uni(rng);
        const int64_t ldy = out + 3;
        std::vector<float> init(rows * ldy);
        for (float& f : init) f = uni(rng);
        for (const CpuIsa isa : isas) {
          for (const bool accumulate : {false, true}) {
            SCOPED_TRACE(::testing::Message()
                         << WeightTypeName(type) << " isa " << CpuIsaName(isa) << " rows " << rows
                         << " out " << out << " cols " << cols << " acc " << accumulate);
            std::vector<float> y = init;
            QuantLinearCpu(x.data(), rows, w.view(), y.data(), ldy, accumulate, isa,
                           CpuActivations::kFp32);
            for (int64_t r = 0; r < rows; ++r) {
              for (int64_t j = 0; j < ldy; ++j) {
                if (j >= out) {  // the padding past the matrix's outputs is untouched
                  ASSERT_EQ(y[r * ldy + j], init[r * ldy + j]);
                  continue;
                }
                double ref = accumulate ? init[r * ldy + j] : 0, mag = std::abs(ref);
                for (int64_t k = 0; k < cols; ++k) {
                  ref += w.values[j * cols + k] * x[r * cols + k];
                  mag += std::abs(w.values[j * cols + k] * x[r * cols + k]);
                }
                ASSERT_NEAR(y[r * ldy + j], ref, 1e-5 * mag + 1e-6);
              }
            }
          }
        }
      }
    }
  }
}

TEST_P(QuantLinearTest, DequantizesRowsExactly) {
  const WeightType type = GetParam();
  std::mt19937 rng(11);
  const int64_t cols = WeightTypeBlockValues(type) > 1 ? 64 : 13;
  const Matrix w = Random(type, 9, cols, rng);
  std::vector<float> portable(4 * cols);
  DequantizeRowsCpu(w.view(), 3, 4, portable.data(), CpuIsa::kPortable);
  for (int64_t i = 0; i < 4 * cols; ++i) {
    ASSERT_NEAR(portable[i], w.values[3 * cols + i], 1e-6 * std::abs(w.values[3 * cols + i]) + 1e-9)
        << i;
  }
  // Every variant gives the same bits (fingerprints hash them).
  for (const CpuIsa isa : {CpuIsa::kAuto, CpuIsa::kAvx2}) {
    if (!CpuSupportsIsa(isa)) continue;
    std::vector<float> out(4 * cols);
    DequantizeRowsCpu(w.view(), 3, 4, out.data(), isa);
    EXPECT_EQ(std::memcmp(out.data(), portable.data(), out.size() * sizeof(float)), 0)
        << CpuIsaName(isa);
  }
}

INSTANTIATE_TEST_SUITE_P(AllTypes, QuantLinearTest,
                         ::testing::Values(WeightType::kF32, WeightType::kF16, WeightType::kBF16,
                                           WeightType::kQ8_0, WeightType::kQ4_0, WeightType::kQ4_1),
                         [](const auto& info) { return std::string(WeightTypeName(info.param)); });

// The int8-activation products (the default) against the fp32-activation path of the same
// variant. Per activation value the quantization error is at most
//   e = amax * (1/254 + 2^-11) * 1.001
// (amax: the largest |x| of its block; half a step of d = amax / 127, plus the fp16 rounding of d
// times |q| <= 127, plus slack for the fp32 x * (1 / d)). So a block moves an output by at most
//   e * sum_j |w_j|                 (Q8_0, Q4_0: the products of the reconstructed x)
//   e * (sum_j |d q_j| + 32 |m|)    (Q4_1: m multiplies s = fp16(d sum q) ~ sum x, whose error
//                                    is 32 e at most, its fp16 rounding included in the 2^-11)
// plus the fp32 rounding both paths have (1e-5 of sum |w x|, as the test above).
TEST_P(QuantLinearTest, Int8ActivationsStayWithinTheQuantizationBound) {
  const WeightType type = GetParam();
  std::mt19937 rng(17);
  std::vector<CpuIsa> isas = {CpuIsa::kPortable};
  for (const CpuIsa isa : {CpuIsa::kAvx2, CpuIsa::kAvx512Bw, CpuIsa::kAvx512Vnni}) {
    if (CpuSupportsIsa(isa)) isas.push_back(isa);
  }
  const int64_t cols = WeightTypeBlockValues(type) > 1 ? 576 : 37;
  for (const int64_t rows : {1, 3, 8, 9}) {
    const Matrix w = Random(type, 67, cols, rng);
    std::normal_distribution<float> normal(0, 1);
    std::vector<float> x(rows * cols);
    for (float& f : x) f = normal(rng) * (rng() % 4 == 0 ? 20.0f : 1.0f);
    if (rows == 3) x[cols + 5] = std::nanf("");  // that row keeps fp32: NaN in, NaN out
    for (const CpuIsa isa : isas) {
      SCOPED_TRACE(::testing::Message()
                   << WeightTypeName(type) << " isa " << CpuIsaName(isa) << " rows " << rows);
      std::vector<float> y8(rows * 67), y32(rows * 67);
      QuantLinearCpu(x.data(), rows, w.view(), y8.data(), 67, false, isa, CpuActivations::kInt8);
      QuantLinearCpu(x.data(), rows, w.view(), y32.data(), 67, false, isa, CpuActivations::kFp32);
      for (int64_t r = 0; r < rows; ++r) {
        int differing = 0;
        for (int64_t j = 0; j < 67; ++j) {
          const float a = y8[r * 67 + j], b = y32[r * 67 + j];
          // fp32 activations where the int8 product does not apply: float weights, the many-row
          // path, and a row holding a NaN.
          if (type == WeightType::kF32 || type == WeightType::kF16 || type == WeightType::kBF16 ||
              rows > kQuantLinearDotMaxRows || (rows == 3 && r == 1)) {
            ASSERT_EQ(std::memcmp(&a, &b, sizeof a), 0) << r << "," << j;
            continue;
          }
          double bound = 0, mag = 0;
          for (int64_t blk = 0; blk < cols / 32; ++blk) {
            double amax = 0, wabs = 0;
            for (int i = 0; i < 32; ++i) {
              const int64_t k = blk * 32 + i;
              amax = std::max(amax, std::abs(double{x[r * cols + k]}));
              wabs += std::abs(w.values[j * cols + k]);
              mag += std::abs(w.values[j * cols + k] * x[r * cols + k]);
            }
            if (type == WeightType::kQ4_1) {  // sum |d q| <= sum |w| + 32 |m|, so 64 |m| in all
              uint16_t mh;
              std::memcpy(&mh, &w.bytes[j * (cols / 32) * 20 + blk * 20 + 2], 2);
              wabs += 64 * std::abs(FromHalf(mh));
            }
            bound += amax * (1.0 / 254 + std::ldexp(1.0, -11)) * 1.001 * wabs;
          }
          ASSERT_NEAR(a, b, bound + 1e-5 * mag + 1e-6) << r << "," << j;
          differing += a != b;
        }
        // The int8 product did run: quantization moves (nearly) every output.
        const bool int8_row = WeightTypeBlockValues(type) > 1 && rows <= kQuantLinearDotMaxRows &&
                              !(rows == 3 && r == 1);
        if (int8_row) {
          EXPECT_GT(differing, 60) << r;
        }
      }
    }
  }
}

TEST(QuantLinearIsaTest, AutoIsTheBestSupported) {
  EXPECT_TRUE(CpuSupportsIsa(CpuKernelIsa()));
  EXPECT_NE(CpuKernelIsa(), CpuIsa::kAuto);
  // Each level includes the one before it, and auto picks the highest.
  CpuIsa best = CpuIsa::kPortable;
  for (const CpuIsa isa : {CpuIsa::kAvx2, CpuIsa::kAvx512Bw, CpuIsa::kAvx512Vnni}) {
    if (!CpuSupportsIsa(isa)) break;
    best = isa;
  }
  EXPECT_EQ(CpuKernelIsa(), best);
  if (CpuSupportsIsa(CpuIsa::kAvx512Vnni)) {
    EXPECT_TRUE(CpuSupportsIsa(CpuIsa::kAvx512Bw));
  }
  if (CpuSupportsIsa(CpuIsa::kAvx512Bw)) {
    EXPECT_TRUE(CpuSupportsIsa(CpuIsa::kAvx2));
  }
}

TEST(QuantLinearIsaTest, ActivationsSettingParsesAndDefaultsToInt8) {
  EXPECT_EQ(ConfiguredCpuActivations(), CpuActivations::kInt8);
  CpuActivations a = CpuActivations::kConfigured;
  ASSERT_TRUE(ParseCpuActivations("fp32", &a));
  EXPECT_EQ(a, CpuActivations::kFp32);
  ASSERT_TRUE(ParseCpuActivations("int8", &a));
  EXPECT_EQ(a, CpuActivations::kInt8);
  for (const char* bad : {"", "INT8", "fp16", "configured", "int8 "}) {
    EXPECT_FALSE(ParseCpuActivations(bad, &a)) << bad;
  }
  // The process setting is what kConfigured products use.
  std::mt19937 rng(2);
  const Matrix w = Random(WeightType::kQ4_1, 40, 64, rng);
  std::vector<float> x(64);
  for (float& f : x) f = static_cast<float>(rng() % 1000) / 250 - 2;
  std::vector<float> y(40), y8(40), y32(40);
  QuantLinearCpu(x.data(), 1, w.view(), y8.data(), 40, false, CpuIsa::kAuto, CpuActivations::kInt8);
  QuantLinearCpu(x.data(), 1, w.view(), y32.data(), 40, false, CpuIsa::kAuto,
                 CpuActivations::kFp32);
  SetCpuActivations(CpuActivations::kFp32);
  EXPECT_EQ(ConfiguredCpuActivations(), CpuActivations::kFp32);
  QuantLinearCpu(x.data(), 1, w.view(), y.data(), 40);
  EXPECT_EQ(y, y32);
  SetCpuActivations(CpuActivations::kConfigured);
  EXPECT_EQ(ConfiguredCpuActivations(), CpuActivations::kInt8);
  QuantLinearCpu(x.data(), 1, w.view(), y.data(), 40);
  EXPECT_EQ(y, y8);
  EXPECT_NE(y8, y32);
}

TEST(CpuThreadsTest, EveryIndexRunsOnceForAnyThreadCount) {
  for (const int threads : {1, 2, 3, 5}) {
    SetCpuKernelThreads(threads);
    EXPECT_EQ(CpuKernelThreads(), threads);
    for (const int64_t n : {1, 2, 15, 16, 17, 1000}) {
      for (const int64_t grain : {1, 4, 16}) {
        std::vector<std::atomic<int>> hits(n);
        CpuParallelFor(n, grain, [&](int64_t begin, int64_t end) {
          EXPECT_TRUE(begin % grain == 0 || begin == 0);
          for (int64_t i = begin; i < end; ++i) hits[i].fetch_add(1);
        });
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << n << "/" << grain;
      }
    }
  }
  SetCpuKernelThreads(0);
  EXPECT_EQ(CpuKernelThreads(), DefaultCpuKernelThreads());
  EXPECT_GE(PhysicalCoreCount(), 1);
}

TEST(CpuThreadsTest, ConcurrentCallersAndNestedLoopsComplete) {
  SetCpuKernelThreads(3);
  std::atomic<int64_t> total{0};
  auto work = [&] {
    for (int rep = 0; rep < 200; ++rep) {
      CpuParallelFor(64, 4, [&](int64_t begin, int64_t end) {
        // A nested loop runs on its caller's thread.
        CpuParallelFor(end - begin, 1, [&](int64_t b, int64_t e) { total.fetch_add(e - b); });
      });
    }
  };
  std::thread a(work), b(work);
  a.join();
  b.join();
  EXPECT_EQ(total.load(), 2 * 200 * 64);
  SetCpuKernelThreads(0);
}

}  // namespace
}  // namespace lazyattn
