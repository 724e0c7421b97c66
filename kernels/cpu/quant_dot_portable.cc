// Portable dot products over stored weights: the reference the SIMD variants are tested against,
// and what runs on CPUs without them.
#include <cstring>

#include "kernels/cpu/quant_dot.h"

namespace lazyattn::quant_internal {
namespace {

uint16_t Load16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

float DotRow(const DotArgs& a, const uint8_t* row) {
  const int64_t cols = a.cols;
  const float* x = a.x;
  float sum = 0;
  switch (a.type) {
    case WeightType::kF32: {
      for (int64_t k = 0; k < cols; ++k) {
        float w;
        std::memcpy(&w, row + 4 * k, sizeof w);
        sum += w * x[k];
      }
      return sum;
    }
    case WeightType::kF16:
      for (int64_t k = 0; k < cols; ++k) sum += HalfBitsToFloat(Load16(row + 2 * k)) * x[k];
      return sum;
    case WeightType::kBF16:
      for (int64_t k = 0; k < cols; ++k) sum += Bf16BitsToFloat(Load16(row + 2 * k)) * x[k];
      return sum;
    case WeightType::kQ8_0:
      for (int64_t b = 0; b < cols / kBlock; ++b) {
        const uint8_t* blk = row + b * 34;
        const float* xb = x + b * kBlock;
        float s = 0;
        for (int i = 0; i < kBlock; ++i)
          s += static_cast<float>(static_cast<int8_t>(blk[2 + i])) * xb[i];
        sum += HalfBitsToFloat(Load16(blk)) * s;
      }
      return sum;
    case WeightType::kQ4_0:
    case WeightType::kQ4_1: {
      const bool q41 = a.type == WeightType::kQ4_1;
      const size_t block_bytes = q41 ? 20 : 18, qs = q41 ? 4 : 2;
      for (int64_t b = 0; b < cols / kBlock; ++b) {
        const uint8_t* blk = row + b * block_bytes;
        const float* xb = x + b * kBlock;
        float s = 0;
        for (int j = 0; j < 16; ++j) {
          s += static_cast<float>(blk[qs + j] & 0x0F) * xb[j];
          s += static_cast<float>(blk[qs + j] >> 4) * xb[j + 16];
        }
        const float d = HalfBitsToFloat(Load16(blk));
        // Q4_0 stores q - 8: d (q - 8) summed is d sum(q x) - 8 d sum(x).
        const float m = q41 ? HalfBitsToFloat(Load16(blk + 2)) : -8.0f * d;
        sum += d * s + m * a.x_block_sums[b];
      }
      return sum;
    }
  }
  return sum;
}

}  // namespace

float HalfBitsToFloat(uint16_t h) {
  const uint32_t sign = uint32_t{h & 0x8000u} << 16;
  const uint32_t exp = (h >> 10) & 0x1F, mant = h & 0x3FF;
  uint32_t bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (mant << 13);  // inf / NaN
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {  // subnormal: value = mant * 2^-24
    float f = static_cast<float>(mant) * 5.9604644775390625e-8f;
    std::memcpy(&bits, &f, sizeof bits);
    bits |= sign;
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

void DotRowsPortable(const DotArgs& a) {
  for (int64_t j = 0; j < a.n; ++j) {
    const float v = DotRow(a, a.w + j * a.row_bytes);
    a.y[j] = a.accumulate ? a.y[j] + v : v;
  }
}

}  // namespace lazyattn::quant_internal
