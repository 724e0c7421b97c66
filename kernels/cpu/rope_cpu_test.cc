#include <cmath>
#include <numbers>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/include/rope.h"

namespace lazyattn {
namespace {

std::vector<float> RandomVector(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0, 1);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

double Dot(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += double{a[i]} * b[i];
  return s;
}

TEST(RopeTest, TableIsAccurateAtLargePositions) {
  RopeParams p{.head_dim = 128, .theta = 500000};
  const int64_t kMax = 131072;
  RopeTable table(p, kMax);
  for (int64_t pos : {int64_t{0}, int64_t{1}, int64_t{65535}, int64_t{65536}, kMax - 1}) {
    for (int i : {0, 1, 17, 63}) {
      const double angle = pos * std::pow(500000.0, -2.0 * i / 128);
      EXPECT_NEAR(table.cos_row(pos)[i], std::cos(angle), 1e-7) << pos << " " << i;
      EXPECT_NEAR(table.sin_row(pos)[i], std::sin(angle), 1e-7) << pos << " " << i;
    }
  }
}

TEST(RopeTest, ScoresDependOnlyOnRelativePosition) {
  RopeParams p{.head_dim = 64, .theta = 10000};
  RopeTable table(p, 300000);
  const auto q = RandomVector(64, 1), k = RandomVector(64, 2);
  // (R_n q).(R_m k) == q.(R_{m-n} k), including offsets past 65,535.
  for (auto [n, m] : std::vector<std::pair<int64_t, int64_t>>{{5, 9}, {70000, 200000}, {3, 1}}) {
    auto qn = q, km = k, krel = k;
    RopeRotateHeadCpu(qn.data(), n, table);
    RopeRotateHeadCpu(km.data(), m, table);
    RopeRotateHeadCpu(krel.data(), m - n, table);
    EXPECT_NEAR(Dot(qn, km), Dot(q, krel), 2e-4 * std::sqrt(Dot(q, q) * Dot(k, k)));
  }
}

TEST(RopeTest, BackwardUndoesForwardAndKeepsNorm) {
  RopeParams p{.head_dim = 128, .theta = 500000};
  RopeTable table(p, 200001);
  const auto x = RandomVector(128, 3);
  auto y = x;
  RopeRotateHeadCpu(y.data(), 200000, table);
  EXPECT_NEAR(Dot(y, y), Dot(x, x), 1e-3);
  RopeRotateHeadCpu(y.data(), -200000, table);
  for (int i = 0; i < 128; ++i) EXPECT_NEAR(y[i], x[i], 1e-5) << i;
}

TEST(RopeTest, HalfSplitLayoutPairsIWithIPlusHalf) {
  RopeParams p{.head_dim = 4, .theta = 10000};
  RopeTable table(p, 4);
  // Only x[0] set: after rotating by pos 1, it moves into x[2] (its pair), never into x[1].
  std::vector<float> x = {1, 0, 0, 0};
  RopeRotateHeadCpu(x.data(), 1, table);
  EXPECT_NEAR(x[0], std::cos(1.0), 1e-6);
  EXPECT_NEAR(x[2], std::sin(1.0), 1e-6);
  EXPECT_EQ(x[1], 0.0f);
  EXPECT_EQ(x[3], 0.0f);
}

TEST(RopeTest, Llama3ScalingKeepsHighAndSlowsLowFrequencies) {
  // Llama-3.1-8B's parameters.
  RopeParams p{.head_dim = 128, .theta = 500000};
  p.scaling = {.type = RopeScaling::Type::kLlama3,
               .factor = 8,
               .low_freq_factor = 1,
               .high_freq_factor = 4,
               .original_max_positions = 8192};
  RopeParams plain = p;
  plain.scaling = {};
  const auto scaled = RopeInverseFrequencies(p), base = RopeInverseFrequencies(plain);
  int kept = 0, divided = 0, smoothed = 0;
  for (int i = 0; i < 64; ++i) {
    const double wavelen = 2 * std::numbers::pi / base[i];
    if (wavelen < 8192.0 / 4) {
      EXPECT_DOUBLE_EQ(scaled[i], base[i]);
      ++kept;
    } else if (wavelen > 8192.0) {
      EXPECT_DOUBLE_EQ(scaled[i], base[i] / 8);
      ++divided;
    } else {
      EXPECT_LT(scaled[i], base[i]);
      EXPECT_GT(scaled[i], base[i] / 8);
      ++smoothed;
    }
  }
  EXPECT_GT(kept, 0);
  EXPECT_GT(divided, 0);
  EXPECT_GT(smoothed, 0);
}

TEST(RopeTest, FreqFactorsDivideInverseFrequencies) {
  RopeParams p{.head_dim = 8, .theta = 10000, .freq_factors = {1, 2, 4, 8}};
  const auto f = RopeInverseFrequencies(p);
  for (int i = 0; i < 4; ++i) EXPECT_DOUBLE_EQ(f[i], std::pow(10000.0, -2.0 * i / 8) / (1 << i));
}

}  // namespace
}  // namespace lazyattn
