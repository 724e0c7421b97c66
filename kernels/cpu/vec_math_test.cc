#include "kernels/cpu/vec_math.h"

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/include/quant_linear.h"

namespace lazyattn::cpu_internal {
namespace {

// Every variant this CPU runs, portable first.
struct Variant {
  const char* name;
  double (*exp_shift_sum)(float*, int64_t, float);
  void (*silu_mul)(const float*, const float*, int64_t, float*);
};
std::vector<Variant> Variants() {
  std::vector<Variant> v = {{"portable", ExpShiftSumPortable, SiluMulPortable}};
  if (CpuSupportsIsa(CpuIsa::kAvx2)) v.push_back({"avx2", ExpShiftSumAvx2, SiluMulAvx2});
  v.push_back({"dispatched", ExpShiftSum, SiluMul});
  return v;
}

// Relative error against exp in double: 2 ulp of fp32 (2^-22) over the normal range; each size from
// 1 to 19 covers the vector body and every tail length.
TEST(VecMathTest, ExpShiftSumWithinTwoUlpAndSumsWhatItWrote) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-87.3f, 88.7f);
  for (const Variant& var : Variants()) {
    for (int n : {1, 7, 8, 9, 16, 19, 1000}) {
      std::vector<float> x(n + 1);
      for (float& f : x) f = dist(rng);
      const float guard = x[n];
      std::vector<float> in = x;
      // Arguments from -147 (below the normal range) to 28.7; the sum stays finite.
      const float shift = 60.0f;
      const double sum = var.exp_shift_sum(x.data(), n, shift);
      double want_sum = 0;
      for (int i = 0; i < n; ++i) {
        const float arg = in[i] - shift;
        const double want = std::exp(static_cast<double>(arg));
        if (arg < -87.33f) {
          ASSERT_LE(x[i], 1.2e-38f) << var.name << " x=" << arg;  // ~0 either way
        } else {
          ASSERT_LE(std::abs(x[i] - want), 2.4e-7 * want) << var.name << " x=" << arg;
        }
        want_sum += x[i];
      }
      EXPECT_EQ(x[n], guard) << var.name << ": wrote past n";
      EXPECT_NEAR(sum, want_sum, 1e-6 * want_sum) << var.name << " n=" << n;
    }
  }
}

TEST(VecMathTest, ExpEdges) {
  for (const Variant& var : Variants()) {
    std::vector<float> x = {0.0f, -200.0f, std::numeric_limits<float>::quiet_NaN(), 88.7f};
    var.exp_shift_sum(x.data(), 4, 0.0f);
    EXPECT_EQ(x[0], 1.0f) << var.name;  // the softmax maximum's own weight is exactly 1
    EXPECT_LE(x[1], 1e-37f) << var.name;
    EXPECT_GE(x[1], 0.0f) << var.name;
    EXPECT_TRUE(std::isnan(x[2])) << var.name;
    const double e = std::exp(static_cast<double>(88.7f));  // near FLT_MAX, still accurate
    EXPECT_NEAR(x[3], e, 2.4e-7 * e) << var.name;
  }
}

TEST(VecMathTest, SiluMulMatchesDoubleFormula) {
  std::mt19937 rng(11);
  std::normal_distribution<float> dist(0.0f, 6.0f);
  for (const Variant& var : Variants()) {
    for (int n : {1, 5, 8, 13, 1536}) {
      std::vector<float> g(n), u(n), out(n + 1, 123.0f);
      for (int i = 0; i < n; ++i) g[i] = dist(rng), u[i] = dist(rng);
      g[0] = -100.0f;  // exp(100) stays finite in double; fp32 saturates, the product is ~0
      var.silu_mul(g.data(), u.data(), n, out.data());
      for (int i = 0; i < n; ++i) {
        const double want = g[i] / (1.0 + std::exp(-static_cast<double>(g[i]))) * u[i];
        // A few roundings (exp, add, divide, multiply), each 2^-24 relative, plus exp's 2 ulp.
        ASSERT_NEAR(out[i], want, 1e-6 * std::abs(want) + 1e-30) << var.name << " g=" << g[i];
      }
      EXPECT_EQ(out[n], 123.0f) << var.name << ": wrote past n";
    }
  }
}

}  // namespace
}  // namespace lazyattn::cpu_internal
