// 8-bit activations (quant_int8.h, CpuActivations::kInt8 in quant_linear.h): the quantizer against
// a scalar transcription of ggml's quantize_row_q8_0/q8_1 reference formula, every SIMD dot the
// CPU runs against the portable one, and the linear layer against its fp32-activation path within
// the bound the quantization allows. The binary prints which SIMD variants it ran: the AVX-512
// ones are compiled everywhere but only run where the CPU has them.
#include "kernels/cpu/quant_int8.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/quant_dot.h"
#include "kernels/include/quant_linear.h"

namespace lazyattn::quant_internal {
namespace {

// Every finite non-negative half value, decoded with ldexp (independently of the kernels).
const std::vector<double>& HalfValues() {
  static const std::vector<double> values = [] {
    std::vector<double> v(0x7C00);
    for (uint32_t h = 0; h < 0x7C00; ++h) {
      const uint32_t e = h >> 10, m = h & 0x3FF;
      v[h] = e == 0 ? std::ldexp(m, -24) : std::ldexp(1024 + m, static_cast<int>(e) - 25);
    }
    return v;
  }();
  return values;
}

// Round to nearest half, ties to the even bit pattern, 65520 and up to infinity.
uint16_t ReferenceHalf(float f) {
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  const double a = std::fabs(static_cast<double>(f));
  if (a >= 65520.0) return sign | 0x7C00;
  const auto& v = HalfValues();
  const auto hi = std::lower_bound(v.begin(), v.end(), a);
  if (hi == v.begin()) return sign;
  const uint16_t h = static_cast<uint16_t>(hi - v.begin()), l = h - 1;
  if (hi == v.end()) return sign | l;
  const double dl = a - v[l], dh = v[h] - a;
  return sign | (dl < dh ? l : dh < dl ? h : (l % 2 == 0 ? l : h));
}

TEST(QuantInt8Test, FloatToHalfRoundsToNearestEven) {
  std::mt19937 rng(3);
  std::vector<float> cases = {0.0f,    -0.0f,    1.0f,     65504.0f, 65519.99f, 65520.0f, 1e9f,
                              6.1e-5f, 5.96e-8f, 2.98e-8f, 2.99e-8f, 1e-30f,    1e-40f,   -3.1e-5f};
  for (uint32_t h = 0; h < 0x7C00; ++h) {  // every half, and both neighbours of every midpoint
    const double mid = h + 1 < 0x7C00 ? (HalfValues()[h] + HalfValues()[h + 1]) / 2 : 65520.0;
    const float m = static_cast<float>(mid);
    cases.push_back(static_cast<float>(HalfValues()[h]));
    cases.push_back(m);
    cases.push_back(std::nextafter(m, 0.0f));
    cases.push_back(std::nextafter(m, 1e30f));
  }
  std::uniform_real_distribution<float> exp(-30, 17), mant(1, 2);
  for (int i = 0; i < 200000; ++i)
    cases.push_back(std::ldexp(mant(rng), exp(rng)) * (i % 2 ? -1 : 1));
  for (const float f : cases) ASSERT_EQ(FloatToHalfBits(f), ReferenceHalf(f)) << f;
  EXPECT_EQ(FloatToHalfBits(std::numeric_limits<float>::infinity()), 0x7C00);
  EXPECT_EQ(FloatToHalfBits(std::nanf("")) & 0x7C00, 0x7C00);
  EXPECT_NE(FloatToHalfBits(std::nanf("")) & 0x3FF, 0);
}

// ggml's quantize_row_q8_1_ref, transcribed (q8_0's qs and d are the same).
struct RefBlock {
  int8_t qs[32];
  uint16_t d, s;
};
RefBlock ReferenceQuantize(const float* x) {
  RefBlock r;
  float amax = 0;
  for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / ((1 << 7) - 1);
  const float id = d ? 1.0f / d : 0.0f;
  r.d = ReferenceHalf(d);
  int sum = 0;
  for (int j = 0; j < 32; ++j) {
    r.qs[j] = static_cast<int8_t>(std::roundf(x[j] * id));
    sum += r.qs[j];
  }
  r.s = ReferenceHalf(static_cast<float>(sum) * d);
  return r;
}

struct Quantized {
  std::vector<int8_t> qs;
  std::vector<float> d, s;
  std::vector<int32_t> qsum;
  explicit Quantized(int64_t blocks) : qs(32 * blocks), d(blocks), s(blocks), qsum(blocks) {}
  Q8Row row() { return {qs.data(), d.data(), s.data(), qsum.data()}; }
};

TEST(QuantInt8Test, QuantizesRowsAsGgmlsReferenceBitForBit) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0, 1);
  for (const int64_t blocks : {1, 2, 3, 18, 48}) {
    for (const float scale : {1.0f, 1e-3f, 300.0f, 1e-20f, 1e-35f}) {
      std::vector<float> x(32 * blocks);
      for (float& v : x) v = normal(rng) * scale;
      std::fill(x.begin(), x.begin() + 32, 0.0f);  // an all-zero block: d = 0, no 0 / 0
      if (blocks > 1) x[33] = -scale * 7;          // a lone outlier
      if (blocks > 2) {
        // d = c exactly (a power of two), so x * id lands on k + 0.5: roundf goes away from
        // zero where round-to-even would not.
        const float c = std::ldexp(1.0f, std::ilogb(scale));
        x[64] = 127 * c;
        for (int k = 0; k < 6; ++k) {
          x[65 + k] = (k + 0.5f) * c;
          x[71 + k] = -(k + 0.5f) * c;
        }
      }
      Quantized q(blocks);
      ASSERT_TRUE(QuantizeRowQ8(x.data(), blocks, true, q.row())) << scale;
      for (int64_t b = 0; b < blocks; ++b) {
        SCOPED_TRACE(::testing::Message()
                     << "blocks " << blocks << " scale " << scale << " b " << b);
        const RefBlock ref = ReferenceQuantize(&x[32 * b]);
        ASSERT_EQ(FloatToHalfBits(q.d[b]), ref.d);
        ASSERT_EQ(FloatToHalfBits(q.s[b]), ref.s);
        int32_t sum = 0;
        for (int j = 0; j < 32; ++j) {
          ASSERT_EQ(q.qs[32 * b + j], ref.qs[j]) << j;
          sum += ref.qs[j];
        }
        ASSERT_EQ(q.qsum[b], sum);
      }
    }
  }
}

TEST(QuantInt8Test, ExtremeValuesNeverGiveNaNOrOutOfRangeValues) {
  // Below ~3.7e-37 the formula's 1 / d overflows (ggml converts inf to int8 there): q is +-127 or
  // 0, and the fp16 d is 0, so the block adds nothing.
  for (const float tiny : {1e-38f, 1e-40f, 1e-45f}) {
    std::vector<float> x(32, 0.0f);
    x[3] = tiny;
    x[9] = -tiny / 2;
    Quantized q(1);
    ASSERT_TRUE(QuantizeRowQ8(x.data(), 1, true, q.row()));
    EXPECT_EQ(q.d[0], 0.0f);
    EXPECT_FALSE(std::isnan(q.s[0]));
    for (int j = 0; j < 32; ++j) EXPECT_LE(std::abs(q.qs[j]), 127);
    EXPECT_EQ(q.qs[0], 0);
  }
  // The largest block whose scale fits fp16 quantizes; past it, and with inf or NaN, the row is
  // refused (the caller keeps fp32 for it).
  std::vector<float> x(64, 1.0f);
  Quantized q(2);
  x[40] = 65504.0f * 127;
  EXPECT_TRUE(QuantizeRowQ8(x.data(), 2, false, q.row()));
  EXPECT_EQ(q.d[1], 65504.0f);
  EXPECT_EQ(q.qs[40], 127);
  x[40] = 65536.0f * 127;
  EXPECT_FALSE(QuantizeRowQ8(x.data(), 2, false, q.row()));
  for (const float bad : {std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(), std::nanf("")}) {
    x[40] = 1.0f;
    x[5] = bad;
    EXPECT_FALSE(QuantizeRowQ8(x.data(), 2, false, q.row())) << bad;
    x[5] = 1.0f;
  }
  // q8_1's s = d * sum(q) overflows fp16 before d does: refused only when s is wanted.
  std::fill(x.begin(), x.end(), 3000.0f);
  EXPECT_TRUE(QuantizeRowQ8(x.data(), 2, false, q.row()));
  EXPECT_FALSE(QuantizeRowQ8(x.data(), 2, true, q.row()));
}

using DotFn = void (*)(const Int8DotArgs&);
struct Variant {
  CpuIsa isa;
  DotFn fn;
};
// The SIMD variants this CPU runs, printed once so a log shows which ones a run covered.
std::vector<Variant> SimdVariants() {
  std::vector<Variant> v;
  const Variant all[] = {{CpuIsa::kAvx2, DotRowsInt8Avx2},
                         {CpuIsa::kAvx512Bw, DotRowsInt8Avx512Bw},
                         {CpuIsa::kAvx512Vnni, DotRowsInt8Avx512Vnni}};
  for (const Variant& x : all) {
    if (CpuSupportsIsa(x.isa)) v.push_back(x);
  }
  static const bool printed = [&] {
    std::cout << "int8 dot variants run: portable";
    for (const Variant& x : v) std::cout << ", " << CpuIsaName(x.isa);
    std::cout << " (CpuKernelIsa: " << CpuIsaName(CpuKernelIsa()) << ")\n";
    return true;
  }();
  (void)printed;
  return v;
}

void PutHalf(uint8_t* p, float f) {
  const uint16_t h = FloatToHalfBits(f);
  std::memcpy(p, &h, 2);
}

// Random weight blocks; scales from `scales` (chosen by the caller to keep sums exact or not).
std::vector<uint8_t> RandomWeights(WeightType type, int64_t rows, int64_t blocks, std::mt19937& rng,
                                   const std::vector<float>& scales,
                                   const std::vector<float>& mins) {
  const size_t bytes = type == WeightType::kQ8_0 ? 34 : type == WeightType::kQ4_1 ? 20 : 18;
  std::vector<uint8_t> w(rows * blocks * bytes);
  std::uniform_int_distribution<int> byte(0, 255), pick(0, 1 << 20);
  for (int64_t i = 0; i < rows * blocks; ++i) {
    uint8_t* blk = &w[i * bytes];
    PutHalf(blk, scales[pick(rng) % scales.size()]);
    if (type == WeightType::kQ4_1) PutHalf(blk + 2, mins[pick(rng) % mins.size()]);
    for (size_t j = type == WeightType::kQ4_1 ? 4 : 2; j < bytes; ++j) blk[j] = byte(rng);
  }
  return w;
}

const WeightType kInt8Types[] = {WeightType::kQ8_0, WeightType::kQ4_0, WeightType::kQ4_1};

// Integer scales and activations small enough that every fp32 operation of every variant is exact
// (all partial sums are integers below 2^24): the SIMD results must equal the portable ones bit
// for bit, which checks their integer sums exactly, the Q8_0 sign trick and Q4_0's -8 included.
TEST(QuantInt8Test, SimdDotsEqualPortableExactlyOnExactInputs) {
  std::mt19937 rng(9);
  for (const WeightType type : kInt8Types) {
    for (const int64_t blocks : {1, 2, 3, 5, 18}) {
      const int64_t rows = 13;
      const auto w = RandomWeights(type, rows, blocks, rng, {1, 2}, {-8, -3, 0, 5});
      Quantized x(blocks);
      std::uniform_int_distribution<int> q(-31, 31), scale(1, 2);
      for (int8_t& v : x.qs) v = static_cast<int8_t>(q(rng));
      x.qs[0] = -31;  // negative activations under negative weights
      for (int64_t b = 0; b < blocks; ++b) {
        x.d[b] = static_cast<float>(scale(rng));
        x.qsum[b] = 0;
        for (int j = 0; j < 32; ++j) x.qsum[b] += x.qs[32 * b + j];
        x.s[b] = x.d[b] * static_cast<float>(x.qsum[b]);
      }
      std::vector<float> ref(rows), out(rows);
      Int8DotArgs a{type,       w.data(),   w.size() / rows, rows,       blocks, x.qs.data(),
                    x.d.data(), x.s.data(), x.qsum.data(),   ref.data(), false};
      DotRowsInt8Portable(a);
      for (const Variant& v : SimdVariants()) {
        a.y = out.data();
        v.fn(a);
        for (int64_t j = 0; j < rows; ++j) {
          ASSERT_EQ(out[j], ref[j]) << WeightTypeName(type) << " " << CpuIsaName(v.isa)
                                    << " blocks " << blocks << " row " << j;
        }
      }
    }
  }
}

// Realistic scales: the portable dot against a double evaluation of ggml's formula, and every
// SIMD dot against the portable one within fp32 summation-order error.
TEST(QuantInt8Test, DotsMatchTheFormulaOnRandomInputs) {
  std::mt19937 rng(13);
  std::normal_distribution<float> normal(0, 1);
  for (const WeightType type : kInt8Types) {
    for (const int64_t blocks : {1, 3, 18, 48}) {
      const int64_t rows = 9;
      const auto w =
          RandomWeights(type, rows, blocks, rng, {0.0123f, 0.031f, 0.0021f}, {-0.11f, -0.02f});
      const size_t row_bytes = w.size() / rows;
      std::vector<float> xf(32 * blocks);
      for (float& v : xf) v = normal(rng) * 3;
      Quantized x(blocks);
      ASSERT_TRUE(QuantizeRowQ8(xf.data(), blocks, true, x.row()));
      std::vector<float> ref(rows), out(rows, 0.0f);
      Int8DotArgs a{type,       w.data(),   row_bytes,     rows,       blocks, x.qs.data(),
                    x.d.data(), x.s.data(), x.qsum.data(), ref.data(), false};
      DotRowsInt8Portable(a);
      for (int64_t j = 0; j < rows; ++j) {
        double exact = 0, mag = 0;
        for (int64_t b = 0; b < blocks; ++b) {
          const uint8_t* blk = &w[j * row_bytes + b * (row_bytes / blocks)];
          uint16_t dh, mh;
          std::memcpy(&dh, blk, 2);
          std::memcpy(&mh, blk + 2, 2);
          const double scale = HalfBitsToFloat(dh) * static_cast<double>(x.d[b]);
          int64_t sumi = 0, abs_sumi = 0;
          for (int i = 0; i < 32; ++i) {
            int wq;
            if (type == WeightType::kQ8_0) {
              wq = static_cast<int8_t>(blk[2 + i]);
            } else {
              const uint8_t* qs = blk + (type == WeightType::kQ4_1 ? 4 : 2);
              wq = (i < 16 ? qs[i] & 0xF : qs[i - 16] >> 4) - (type == WeightType::kQ4_0 ? 8 : 0);
            }
            sumi += wq * x.qs[32 * b + i];
            abs_sumi += std::abs(wq * x.qs[32 * b + i]);
          }
          const double off = type == WeightType::kQ4_1 ? HalfBitsToFloat(mh) * double{x.s[b]} : 0;
          exact += scale * sumi + off;
          // Q4_0's -8 * sum(q) is a term of its own in the SIMD variants.
          mag += std::abs(scale) * (abs_sumi + 8 * std::abs(x.qsum[b])) + std::abs(off);
        }
        // fp32 error of a sum of n rounded terms in any order is below (n + 1) 2^-24 sum|terms|;
        // the SIMD variants split a block into 8 or 16 lane terms, hence the 40.
        const double order = (2.0 * blocks + 40) * std::ldexp(1.0, -24) * mag;
        ASSERT_NEAR(ref[j], exact, order + 1e-30) << WeightTypeName(type) << " row " << j;
        for (const Variant& v : SimdVariants()) {
          a.y = out.data();
          v.fn(a);
          ASSERT_NEAR(out[j], ref[j], 2 * order + 1e-30)
              << WeightTypeName(type) << " " << CpuIsaName(v.isa) << " blocks " << blocks;
        }
      }
    }
  }
}

}  // namespace
}  // namespace lazyattn::quant_internal
