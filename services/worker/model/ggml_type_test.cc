#include "services/worker/model/ggml_type.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <tuple>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lazyattn {
namespace {

using ::testing::HasSubstr;

// fp16 bit patterns of exactly representable scales used below.
constexpr uint16_t kHalfHalf = 0x3800;        // 0.5
constexpr uint16_t kHalfQuarter = 0x3400;     // 0.25
constexpr uint16_t kHalfNegQuarter = 0xB400;  // -0.25
constexpr uint16_t kHalfThree = 0x4200;       // 3.0
constexpr uint16_t kHalfNegOneHalf = 0xBE00;  // -1.5

void PutU16(std::vector<uint8_t>& v, uint16_t x) {
  v.push_back(static_cast<uint8_t>(x & 0xFF));
  v.push_back(static_cast<uint8_t>(x >> 8));
}

TEST(GgmlTypeTest, Names) {
  EXPECT_EQ(GgmlTypeName(GgmlType::kQ4_1), "Q4_1");
  EXPECT_EQ(GgmlTypeName(GgmlType::kBF16), "BF16");
  EXPECT_EQ(GgmlTypeName(GgmlType::kQ6_K), "Q6_K");
  EXPECT_EQ(GgmlTypeName(static_cast<GgmlType>(99)), "type<99>");
  EXPECT_EQ(GgmlTypeName(static_cast<GgmlType>(5)), "type<5>");  // removed Q4_2
  // Interned names stay valid across calls.
  std::string_view a = GgmlTypeName(static_cast<GgmlType>(1000));
  GgmlTypeName(static_cast<GgmlType>(1001));
  EXPECT_EQ(a, "type<1000>");
}

TEST(GgmlTypeTest, Layouts) {
  struct Case {
    GgmlType type;
    int64_t elements, bytes;
  };
  const Case cases[] = {
      {GgmlType::kF32, 1, 4},      {GgmlType::kF16, 1, 2},      {GgmlType::kBF16, 1, 2},
      {GgmlType::kQ4_0, 32, 18},   {GgmlType::kQ4_1, 32, 20},   {GgmlType::kQ5_0, 32, 22},
      {GgmlType::kQ5_1, 32, 24},   {GgmlType::kQ8_0, 32, 34},   {GgmlType::kQ8_1, 32, 36},
      {GgmlType::kQ2_K, 256, 84},  {GgmlType::kQ3_K, 256, 110}, {GgmlType::kQ4_K, 256, 144},
      {GgmlType::kQ5_K, 256, 176}, {GgmlType::kQ6_K, 256, 210}, {GgmlType::kQ8_K, 256, 292},
      {GgmlType::kI8, 1, 1},       {GgmlType::kI16, 1, 2},      {GgmlType::kI32, 1, 4},
      {GgmlType::kI64, 1, 8},      {GgmlType::kF64, 1, 8},
  };
  for (const Case& c : cases) {
    auto layout = GgmlLayout(c.type);
    ASSERT_TRUE(layout.ok()) << GgmlTypeName(c.type);
    EXPECT_EQ(layout->block_elements, c.elements) << GgmlTypeName(c.type);
    EXPECT_EQ(layout->block_bytes, c.bytes) << GgmlTypeName(c.type);
  }
  auto bad = GgmlLayout(static_cast<GgmlType>(99));
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(bad.status().message(), HasSubstr("99"));
}

TEST(GgmlTypeTest, RowBytes) {
  EXPECT_EQ(*GgmlRowBytes(GgmlType::kQ4_K, 512), 288u);
  EXPECT_EQ(*GgmlRowBytes(GgmlType::kQ8_0, 576), 18u * 34u);
  EXPECT_EQ(*GgmlRowBytes(GgmlType::kF16, 3), 6u);
  EXPECT_EQ(*GgmlRowBytes(GgmlType::kQ4_0, 0), 0u);
  EXPECT_EQ(GgmlRowBytes(GgmlType::kQ4_0, 33).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GgmlRowBytes(GgmlType::kF32, -1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(GgmlRowBytes(GgmlType::kI64, std::numeric_limits<int64_t>::max()).ok());
}

TEST(GgmlTypeTest, HalfToFloat) {
  EXPECT_EQ(HalfToFloat(0x0000), 0.0f);
  EXPECT_TRUE(std::signbit(HalfToFloat(0x8000)));
  EXPECT_EQ(HalfToFloat(0x8000), 0.0f);
  EXPECT_EQ(HalfToFloat(0x3C00), 1.0f);
  EXPECT_EQ(HalfToFloat(0xC000), -2.0f);
  EXPECT_EQ(HalfToFloat(kHalfHalf), 0.5f);
  EXPECT_EQ(HalfToFloat(kHalfThree), 3.0f);
  EXPECT_EQ(HalfToFloat(kHalfNegOneHalf), -1.5f);
  EXPECT_EQ(HalfToFloat(0x7BFF), 65504.0f);                  // largest finite
  EXPECT_EQ(HalfToFloat(0x0400), std::ldexp(1.0f, -14));     // smallest normal
  EXPECT_EQ(HalfToFloat(0x0001), std::ldexp(1.0f, -24));     // smallest subnormal
  EXPECT_EQ(HalfToFloat(0x03FF), std::ldexp(1023.0f, -24));  // largest subnormal
  EXPECT_EQ(HalfToFloat(0x8200), -std::ldexp(512.0f, -24));
  EXPECT_EQ(HalfToFloat(0x7C00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(HalfToFloat(0xFC00), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(HalfToFloat(0x7E00)));
  EXPECT_TRUE(std::isnan(HalfToFloat(0xFC01)));
  // 0x3555 = 1.0101010101b * 2^-2.
  EXPECT_EQ(HalfToFloat(0x3555), (1.0f + 0x155 / 1024.0f) / 4.0f);
}

TEST(GgmlTypeTest, Bf16ToFloat) {
  EXPECT_EQ(Bf16ToFloat(0x3F80), 1.0f);
  EXPECT_EQ(Bf16ToFloat(0xC040), -3.0f);
  EXPECT_EQ(Bf16ToFloat(0x0001), std::ldexp(1.0f, -133));  // subnormal
  EXPECT_EQ(Bf16ToFloat(0x7F80), std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(Bf16ToFloat(0x7FC0)));
}

TEST(GgmlTypeTest, DequantizeF32F16Bf16) {
  const float f32[3] = {1.5f, -0.0f, 1e30f};
  float out[3];
  ASSERT_TRUE(DequantizeToF32(GgmlType::kF32, f32, 3, out).ok());
  EXPECT_EQ(std::memcmp(f32, out, sizeof(f32)), 0);

  // Odd start address: tensors inside quantized files are not naturally aligned.
  std::vector<uint8_t> f16 = {0xAA};
  PutU16(f16, 0x3C00);
  PutU16(f16, 0x0001);
  PutU16(f16, 0xFC00);
  ASSERT_TRUE(DequantizeToF32(GgmlType::kF16, f16.data() + 1, 3, out).ok());
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], std::ldexp(1.0f, -24));
  EXPECT_EQ(out[2], -std::numeric_limits<float>::infinity());

  std::vector<uint8_t> bf16;
  PutU16(bf16, 0x3F80);
  PutU16(bf16, 0xC040);
  PutU16(bf16, 0x4049);  // 3.140625
  ASSERT_TRUE(DequantizeToF32(GgmlType::kBF16, bf16.data(), 3, out).ok());
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], -3.0f);
  EXPECT_EQ(out[2], 3.140625f);
}

TEST(GgmlTypeTest, DequantizeQ8_0) {
  // Two blocks with different scales: checks the per-block stride as well as the formula.
  const uint16_t scales[2] = {kHalfHalf, kHalfNegQuarter};
  const float scale_values[2] = {0.5f, -0.25f};
  std::vector<uint8_t> src;
  std::vector<int8_t> q;
  for (int b = 0; b < 2; ++b) {
    PutU16(src, scales[b]);
    for (int j = 0; j < 32; ++j) {
      const int8_t v = static_cast<int8_t>(b == 0 ? j * 8 - 128 : 127 - j * 3);
      q.push_back(v);
      src.push_back(static_cast<uint8_t>(v));
    }
  }
  ASSERT_EQ(src.size(), 68u);
  std::vector<float> out(64);
  ASSERT_TRUE(DequantizeToF32(GgmlType::kQ8_0, src.data(), 64, out.data()).ok());
  for (int i = 0; i < 64; ++i) {
    EXPECT_EQ(out[i], scale_values[i / 32] * static_cast<float>(q[i])) << i;
  }
  EXPECT_EQ(out[0], -64.0f);
  EXPECT_EQ(out[32], -31.75f);
}

TEST(GgmlTypeTest, DequantizeQ4_0) {
  const uint16_t scales[2] = {kHalfHalf, kHalfThree};
  const float scale_values[2] = {0.5f, 3.0f};
  std::vector<uint8_t> src;
  std::vector<uint8_t> qs;  // the 16 packed bytes of each block
  for (int b = 0; b < 2; ++b) {
    PutU16(src, scales[b]);
    for (int j = 0; j < 16; ++j) {
      // Low and high nibbles differ in every byte, so a wrong nibble order changes the result.
      const uint8_t byte = static_cast<uint8_t>(((j + b) & 0xF) | ((15 - j) << 4));
      qs.push_back(byte);
      src.push_back(byte);
    }
  }
  ASSERT_EQ(src.size(), 36u);
  std::vector<float> out(64);
  ASSERT_TRUE(DequantizeToF32(GgmlType::kQ4_0, src.data(), 64, out.data()).ok());
  for (int i = 0; i < 64; ++i) {
    const int b = i / 32, e = i % 32;
    const uint8_t byte = qs[b * 16 + e % 16];
    const int nibble = e < 16 ? (byte & 0xF) : (byte >> 4);
    EXPECT_EQ(out[i], scale_values[b] * static_cast<float>(nibble - 8)) << i;
  }
  // The nibble-order trap spelled out: element 1 is the LOW nibble of byte 1 (= 1), not the high
  // nibble of byte 0; element 16 is the high nibble of byte 0 (= 15).
  EXPECT_EQ(out[1], 0.5f * (1 - 8));
  EXPECT_EQ(out[16], 0.5f * (15 - 8));
  EXPECT_EQ(out[32 + 31], 3.0f * (0 - 8));
}

TEST(GgmlTypeTest, DequantizeQ4_1) {
  std::vector<uint8_t> src;
  PutU16(src, kHalfQuarter);     // d = 0.25
  PutU16(src, kHalfNegOneHalf);  // m = -1.5
  std::vector<uint8_t> qs;
  for (int j = 0; j < 16; ++j) {
    const uint8_t byte = static_cast<uint8_t>((j & 0xF) | (((j * 7) & 0xF) << 4));
    qs.push_back(byte);
    src.push_back(byte);
  }
  ASSERT_EQ(src.size(), 20u);
  float out[32];
  ASSERT_TRUE(DequantizeToF32(GgmlType::kQ4_1, src.data(), 32, out).ok());
  for (int e = 0; e < 32; ++e) {
    const uint8_t byte = qs[e % 16];
    const int nibble = e < 16 ? (byte & 0xF) : (byte >> 4);
    EXPECT_EQ(out[e], 0.25f * static_cast<float>(nibble) - 1.5f) << e;
  }
  EXPECT_EQ(out[0], -1.5f);
  EXPECT_EQ(out[15], 0.25f * 15 - 1.5f);
  EXPECT_EQ(out[17], 0.25f * 7 - 1.5f);  // high nibble of byte 1 = 7
}

TEST(GgmlTypeTest, DequantizeErrors) {
  float out[32];
  uint8_t src[64] = {};
  absl::Status s = DequantizeToF32(GgmlType::kQ5_0, src, 32, out);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(s.message(), HasSubstr("Q5_0"));
  s = DequantizeToF32(GgmlType::kQ4_K, src, 256, out);
  EXPECT_THAT(s.message(), HasSubstr("Q4_K"));
  s = DequantizeToF32(static_cast<GgmlType>(99), src, 1, out);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(s.message(), HasSubstr("99"));
  EXPECT_EQ(DequantizeToF32(GgmlType::kQ8_0, src, 16, out).code(),
            absl::StatusCode::kInvalidArgument);
}

// F32, F16 and BF16: every element is tested; the first NaN or Inf is found, past a whole run of
// finite values too (the vectorized runs are 1024 elements).
TEST(GgmlTypeTest, FindNonFiniteFloats) {
  const int64_t n = 3000;
  std::vector<float> f32(n, 1.5f);
  EXPECT_FALSE(FindNonFinite(GgmlType::kF32, f32.data(), n).has_value());
  f32[2500] = -std::numeric_limits<float>::infinity();
  f32[2900] = std::numeric_limits<float>::quiet_NaN();
  auto bad = FindNonFinite(GgmlType::kF32, f32.data(), n);
  ASSERT_TRUE(bad.has_value());
  EXPECT_EQ(bad->index, 2500);
  EXPECT_EQ(bad->value, -std::numeric_limits<float>::infinity());
  f32[7] = std::numeric_limits<float>::quiet_NaN();
  bad = FindNonFinite(GgmlType::kF32, f32.data(), n);
  ASSERT_TRUE(bad.has_value());
  EXPECT_EQ(bad->index, 7);
  EXPECT_TRUE(std::isnan(bad->value));
  // The largest finite values are not refused.
  const std::vector<float> big = {std::numeric_limits<float>::max(),
                                  -std::numeric_limits<float>::max()};
  EXPECT_FALSE(FindNonFinite(GgmlType::kF32, big.data(), 2).has_value());

  for (const auto& [type, finite_max, inf, nan] :
       {std::tuple{GgmlType::kF16, uint16_t{0x7BFF}, uint16_t{0x7C00}, uint16_t{0x7E00}},
        std::tuple{GgmlType::kBF16, uint16_t{0x7F7F}, uint16_t{0x7F80}, uint16_t{0x7FC0}}}) {
    SCOPED_TRACE(GgmlTypeName(type));
    std::vector<uint16_t> h(n, finite_max);
    EXPECT_FALSE(FindNonFinite(type, h.data(), n).has_value());
    h[1500] = inf;
    h[2999] = nan;
    bad = FindNonFinite(type, h.data(), n);
    ASSERT_TRUE(bad.has_value());
    EXPECT_EQ(bad->index, 1500);
    EXPECT_EQ(bad->value, std::numeric_limits<float>::infinity());
    h[1500] = finite_max;
    bad = FindNonFinite(type, h.data(), n);
    ASSERT_TRUE(bad.has_value());
    EXPECT_EQ(bad->index, 2999);
    EXPECT_TRUE(std::isnan(bad->value));
  }
}

// Every block type of ggml_type.h: a NaN or Inf in any scale field (d, and m / dmin / s) of the
// third block is reported at that block's first element; finite scales are not refused.
TEST(GgmlTypeTest, FindNonFiniteBlockScales) {
  struct Case {
    GgmlType type;
    std::vector<int> scale_offsets;  // fp16 fields
  };
  const Case cases[] = {
      {GgmlType::kQ4_0, {0}},      {GgmlType::kQ4_1, {0, 2}}, {GgmlType::kQ5_0, {0}},
      {GgmlType::kQ5_1, {0, 2}},   {GgmlType::kQ8_0, {0}},    {GgmlType::kQ8_1, {0, 2}},
      {GgmlType::kQ2_K, {80, 82}}, {GgmlType::kQ3_K, {108}},  {GgmlType::kQ4_K, {0, 2}},
      {GgmlType::kQ5_K, {0, 2}},   {GgmlType::kQ6_K, {208}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(GgmlTypeName(c.type));
    const GgmlBlockLayout layout = *GgmlLayout(c.type);
    const int64_t blocks = 4, n = blocks * layout.block_elements;
    std::vector<uint8_t> bytes(blocks * layout.block_bytes, 0x11);
    auto put = [&](int64_t block, int offset, uint16_t v) {
      std::memcpy(&bytes[block * layout.block_bytes + offset], &v, 2);
    };
    for (int64_t b = 0; b < blocks; ++b) {
      for (int off : c.scale_offsets) put(b, off, 0x7BFF);  // 65504, the largest finite half
    }
    EXPECT_FALSE(FindNonFinite(c.type, bytes.data(), n).has_value());
    for (int off : c.scale_offsets) {
      for (uint16_t v : {uint16_t{0x7E00}, uint16_t{0x7C00}, uint16_t{0xFC00}}) {
        put(2, off, v);
        put(3, off, 0x7E00);
        auto bad = FindNonFinite(c.type, bytes.data(), n);
        ASSERT_TRUE(bad.has_value()) << off << " " << v;
        EXPECT_EQ(bad->index, 2 * layout.block_elements);
        EXPECT_FALSE(std::isfinite(bad->value));
        put(2, off, 0x7BFF);
        put(3, off, 0x7BFF);
      }
    }
  }
  // Q8_K's scale is fp32: a finite scale whose products overflow is refused too.
  std::vector<uint8_t> q8k(2 * 292, 0);
  const float huge = 1e37f;
  std::memcpy(&q8k[292], &huge, 4);
  EXPECT_FALSE(FindNonFinite(GgmlType::kQ8_K, q8k.data(), 512).has_value());  // quants all 0
  q8k[292 + 4 + 9] = 100;
  auto bad = FindNonFinite(GgmlType::kQ8_K, q8k.data(), 512);
  ASSERT_TRUE(bad.has_value());
  EXPECT_EQ(bad->index, 256 + 9);
  EXPECT_EQ(bad->value, std::numeric_limits<float>::infinity());
}

// The value reported for the types the loader dequantizes is that of the element, not the scale:
// a Q4_1 block with a finite d and an infinite m holds +inf; d = inf over a zero quant is NaN.
TEST(GgmlTypeTest, FindNonFiniteReportsTheDequantizedValue) {
  std::vector<uint8_t> q41;
  PutU16(q41, kHalfHalf);
  PutU16(q41, 0x7C00);  // m = +inf
  q41.resize(20, 0x00);
  auto bad = FindNonFinite(GgmlType::kQ4_1, q41.data(), 32);
  ASSERT_TRUE(bad.has_value());
  EXPECT_EQ(bad->index, 0);
  EXPECT_EQ(bad->value, std::numeric_limits<float>::infinity());
  std::vector<uint8_t> q80;
  PutU16(q80, 0x7C00);  // d = +inf, quants 0
  q80.resize(34, 0x00);
  bad = FindNonFinite(GgmlType::kQ8_0, q80.data(), 32);
  ASSERT_TRUE(bad.has_value());
  EXPECT_TRUE(std::isnan(bad->value));
}

// All-ones bytes are NaN in every float encoding and in every block's scale: each type with a
// layout that is not an integer type reports its first element, so no type is left unchecked.
TEST(GgmlTypeTest, FindNonFiniteCoversEveryFloatAndBlockType) {
  for (uint32_t id = 0; id < 64; ++id) {
    const auto type = static_cast<GgmlType>(id);
    const absl::StatusOr<GgmlBlockLayout> layout = GgmlLayout(type);
    if (!layout.ok()) continue;
    SCOPED_TRACE(GgmlTypeName(type));
    const std::vector<uint8_t> ones(2 * layout->block_bytes, 0xFF);
    const auto bad = FindNonFinite(type, ones.data(), 2 * layout->block_elements);
    const bool integer = type == GgmlType::kI8 || type == GgmlType::kI16 ||
                         type == GgmlType::kI32 || type == GgmlType::kI64;
    if (integer) {
      EXPECT_FALSE(bad.has_value());
    } else {
      ASSERT_TRUE(bad.has_value());
      EXPECT_EQ(bad->index, 0);
    }
  }
}

// bf16's largest finite value is 0x7F7F; fp32 values up to just below the midpoint to the next
// step round down to it, the midpoint and above (a tie, and 0x7F7F is odd) round to infinity.
TEST(GgmlTypeTest, FirstNonFiniteAsBf16FindsWhatRoundsToInfinity) {
  const auto from_bits = [](uint32_t bits) {
    float f;
    std::memcpy(&f, &bits, sizeof(f));
    return f;
  };
  const float kept[] = {0.0f,
                        -1.5f,
                        3.3895314e38f /* 0x7F7F0000 */,
                        from_bits(0x7F7F7FFFu),
                        -from_bits(0x7F7F7FFFu),
                        std::numeric_limits<float>::denorm_min()};
  EXPECT_EQ(FirstNonFiniteAsBf16(kept, 6), -1);
  for (const float bad :
       {from_bits(0x7F7F8000u), -from_bits(0x7F7F8000u), std::numeric_limits<float>::max(),
        std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
        std::numeric_limits<float>::quiet_NaN()}) {
    std::vector<float> values = {1.0f, 2.0f, 3.0f, bad, 4.0f, bad};
    EXPECT_EQ(FirstNonFiniteAsBf16(values.data(), 6), 3) << bad;
    EXPECT_EQ(FirstNonFiniteAsBf16(values.data(), 3), -1);
  }
  // Any alignment: the values are read byte-wise.
  std::vector<unsigned char> bytes(1 + 2 * sizeof(float));
  const float values[] = {1.0f, std::numeric_limits<float>::max()};
  std::memcpy(bytes.data() + 1, values, sizeof(values));
  EXPECT_EQ(FirstNonFiniteAsBf16(bytes.data() + 1, 2), 1);
  EXPECT_EQ(FirstNonFiniteAsBf16(nullptr, 0), -1);
}

}  // namespace
}  // namespace lazyattn
