#include "kernels/cpu/decode_rows.h"

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/half_rows.h"
#include "kernels/include/quant_linear.h"

namespace lazyattn::cpu_internal {
namespace {

// The dispatched loops (AVX2 where the CPU has it, for d % 8 == 0 and groups up to 8) against
// double sums, on fp32 and F16 rows, for every group size and head dims with and without a tail.
// Tolerance: fp32 accumulation of d products, ~d * 2^-24 of the sum of |products|.
TEST(DecodeRowsTest, ScoresAndAccumulationMatchDoubleSumsOnBothPoolTypes) {
  std::mt19937 rng(13);
  std::normal_distribution<float> dist(0, 1);
  for (int d : {8, 20, 64, 128}) {
    for (int group = 1; group <= 9; ++group) {
      const int rows = 13;
      std::vector<float> q(group * d), k(rows * d), v(rows * d), p(rows * group);
      for (float& x : q) x = dist(rng);
      for (float& x : k) x = dist(rng);
      for (float& x : v) x = dist(rng);
      for (float& x : p) x = std::abs(dist(rng));
      std::vector<uint16_t> k16(k.size()), v16(v.size());
      FloatToHalfRow(k.data(), int64_t(k.size()), k16.data());
      FloatToHalfRow(v.data(), int64_t(v.size()), v16.data());
      for (bool half : {false, true}) {
        SCOPED_TRACE(testing::Message() << "d " << d << " group " << group << " f16 " << half);
        // What the rows hold: the values, or their halves widened.
        std::vector<float> kk = k, vv = v;
        if (half) {
          HalfToFloatRow(k16.data(), int64_t(k.size()), kk.data());
          HalfToFloatRow(v16.data(), int64_t(v.size()), vv.data());
        }
        const KvRows kr =
            half ? KvRows{.f16 = k16.data(), .rows = rows} : KvRows{.f32 = k.data(), .rows = rows};
        const KvRows vr =
            half ? KvRows{.f16 = v16.data(), .rows = rows} : KvRows{.f32 = v.data(), .rows = rows};
        std::vector<float> scores(rows * group, NAN);
        ScoreRows(q.data(), group, d, 0.5f, kr, scores.data());
        for (int j = 0; j < rows; ++j) {
          for (int g = 0; g < group; ++g) {
            double want = 0, mag = 0;
            for (int x = 0; x < d; ++x) {
              want += double(q[g * d + x]) * kk[j * d + x];
              mag += std::abs(double(q[g * d + x]) * kk[j * d + x]);
            }
            ASSERT_NEAR(scores[j * group + g], 0.5 * want, 0.5 * mag * d * 0x1p-24 + 1e-7);
          }
        }
        std::vector<float> acc(group * d, 1.0f);  // accumulates onto what is there
        AccumulateRows(p.data(), group, d, vr, acc.data());
        for (int g = 0; g < group; ++g) {
          for (int x = 0; x < d; ++x) {
            double want = 1.0, mag = 1.0;
            for (int j = 0; j < rows; ++j) {
              want += double(p[j * group + g]) * vv[j * d + x];
              mag += std::abs(double(p[j * group + g]) * vv[j * d + x]);
            }
            ASSERT_NEAR(acc[g * d + x], want, mag * rows * 0x1p-24 + 1e-7);
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace lazyattn::cpu_internal
