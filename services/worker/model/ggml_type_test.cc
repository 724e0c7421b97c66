#include "services/worker/model/ggml_type.h"

#include <cmath>
#include <cstring>
#include <limits>
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

}  // namespace
}  // namespace lazyattn
