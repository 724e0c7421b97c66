#include "kernels/cpu/half_rows.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/quant_dot.h"
#include "kernels/cpu/quant_int8.h"
#include "kernels/include/paged_attention.h"
#include "kernels/include/quant_linear.h"

namespace lazyattn::cpu_internal {
namespace {

// Every half bit pattern widens to the same float on both forms, and narrowing that float gives
// the pattern back (NaNs: a NaN).
TEST(HalfRowsTest, EveryHalfRoundTrips) {
  std::vector<uint16_t> all(65536), back(65536), back_f16c(65536);
  for (int i = 0; i < 65536; ++i) all[i] = static_cast<uint16_t>(i);
  std::vector<float> wide(65536), wide_f16c(65536);
  HalfToFloatRowPortable(all.data(), 65536, wide.data());
  FloatToHalfRowPortable(wide.data(), 65536, back.data());
  const bool f16c = CpuSupportsIsa(CpuIsa::kAvx2);
  if (f16c) {
    HalfToFloatRowF16c(all.data(), 65536, wide_f16c.data());
    FloatToHalfRowF16c(wide.data(), 65536, back_f16c.data());
  }
  for (int i = 0; i < 65536; ++i) {
    const bool nan = (i & 0x7c00) == 0x7c00 && (i & 0x3ff) != 0;
    if (nan) {
      ASSERT_TRUE(std::isnan(wide[i])) << i;
      ASSERT_EQ(back[i] & 0x7c00, 0x7c00) << i;
      ASSERT_NE(back[i] & 0x3ff, 0) << i;
      continue;
    }
    ASSERT_EQ(back[i], i) << "half 0x" << std::hex << i;
    if (f16c) {
      ASSERT_EQ(std::memcmp(&wide[i], &wide_f16c[i], 4), 0) << i;
      ASSERT_EQ(back_f16c[i], i) << i;
    }
  }
}

// Narrowing rounds to the nearest half, ties to even, overflow to inf, underflow to zero: the
// portable form against F16C's vcvtps2ph on floats of every exponent, halfway cases included.
TEST(HalfRowsTest, NarrowingMatchesF16cAndRoundsToNearest) {
  std::mt19937 rng(3);
  std::vector<float> x;
  for (int i = 0; i < 200000; ++i) {
    uint32_t bits = rng();
    // Exponents around the half range (2^-30 .. 2^17), and every 4096th value a tie.
    bits = (bits & 0x807fffffu) | ((97u + bits % 48) << 23);
    if (i % 4096 == 0) bits = (bits & ~0x1fffu) | 0x1000u;
    float f;
    std::memcpy(&f, &bits, 4);
    x.push_back(f);
  }
  for (float f : {0.0f, -0.0f, 65504.0f, 65519.99f, 65520.0f, 1e9f, -1e9f, 5.96e-8f, 2.98e-8f,
                  2.99e-8f, 1e-10f, std::numeric_limits<float>::infinity()}) {
    x.push_back(f);
  }
  std::vector<uint16_t> h(x.size()), h_f16c(x.size());
  FloatToHalfRowPortable(x.data(), static_cast<int64_t>(x.size()), h.data());
  for (size_t i = 0; i < x.size(); ++i) {
    const float got = quant_internal::HalfBitsToFloat(h[i]);
    // Overflow, both ways: +-inf exactly from 65520 (half-way past the largest half) on.
    ASSERT_EQ(std::isinf(got), std::abs(x[i]) >= 65520.0f) << x[i];
    if (std::isinf(got)) {
      ASSERT_EQ(std::signbit(got), std::signbit(x[i])) << x[i];
      continue;
    }
    // No half lies strictly closer to x than the chosen one: its neighbours are not closer; at a
    // tie (both at the same distance) the chosen one is the even one.
    for (int step : {-1, 1}) {
      const uint16_t n = static_cast<uint16_t>(h[i] + step);
      if ((n & 0x7c00) == 0x7c00) continue;
      if (((h[i] ^ n) & 0x8000) != 0) continue;  // across zero's sign
      const float d_got = std::abs(got - x[i]);
      const float d_n = std::abs(quant_internal::HalfBitsToFloat(n) - x[i]);
      ASSERT_LE(d_got, d_n) << x[i];
      if (d_got == d_n) ASSERT_EQ(h[i] & 1, 0) << "tie not to even at " << x[i];
    }
  }
  if (CpuSupportsIsa(CpuIsa::kAvx2)) {
    FloatToHalfRowF16c(x.data(), static_cast<int64_t>(x.size()), h_f16c.data());
    for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(h[i], h_f16c[i]) << x[i];
  }
}

// PagedKvWriteCpu into F16 pools stores each value as its nearest half, in the slot the fp32
// form uses, and nothing else.
TEST(HalfRowsTest, KvWriteF16StoresTheRoundedValuesInTheSameSlots) {
  const PagedKvShape shape{.num_kv_heads = 3, .head_dim = 20, .block_size = 16};
  const int n = 37, blocks = 5;
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0, 3);
  std::vector<float> k(n * 3 * 20), v(n * 3 * 20);
  for (float& f : k) f = dist(rng);
  for (float& f : v) f = dist(rng);
  std::vector<int64_t> slots(n);
  for (int t = 0; t < n; ++t) slots[t] = (t * 7 + 3) % (blocks * 16);  // scattered, distinct
  std::vector<float> k32(blocks * shape.block_stride(), 0), v32 = k32;
  std::vector<uint16_t> k16(k32.size(), 0x7e00), v16(k32.size(), 0x7e00);  // NaN = untouched
  PagedKvWriteCpu(k.data(), v.data(), n, slots.data(), shape, k32.data(), v32.data());
  PagedKvWriteCpu(k.data(), v.data(), n, slots.data(), shape, k16.data(), v16.data());
  std::vector<bool> written(k32.size(), false);
  for (int t = 0; t < n; ++t)
    for (int h = 0; h < 3; ++h)
      for (int x = 0; x < 20; ++x)
        written[shape.offset(slots[t] / 16, h, slots[t] % 16) + x] = true;
  for (size_t i = 0; i < k32.size(); ++i) {
    if (!written[i]) {
      ASSERT_EQ(k16[i], 0x7e00) << i;
      ASSERT_EQ(v16[i], 0x7e00) << i;
      continue;
    }
    ASSERT_EQ(k16[i], quant_internal::FloatToHalfBits(k32[i])) << i;
    ASSERT_EQ(v16[i], quant_internal::FloatToHalfBits(v32[i])) << i;
    ASSERT_LE(std::abs(quant_internal::HalfBitsToFloat(k16[i]) - k32[i]),
              std::abs(k32[i]) * 0x1p-11f);
  }
}

}  // namespace
}  // namespace lazyattn::cpu_internal
