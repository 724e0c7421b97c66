// Activation quantization (every CPU) and the portable int8 dot products: the reference the SIMD
// variants are tested against, and what runs on CPUs without them (quant_int8.h).
#include <cmath>
#include <cstring>

#include "kernels/cpu/quant_dot.h"
#include "kernels/cpu/quant_int8.h"

namespace lazyattn::quant_internal {
namespace {

float Half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, sizeof h);
  return HalfBitsToFloat(h);
}

// roundf into [-127, 127], NaN to 0: the formula's value wherever it has one (|v| <= 127 up to
// rounding), and no undefined float-to-int conversion where it has none.
int8_t RoundToInt8(float v) {
  if (!(v == v)) return 0;
  const float r = std::roundf(v);
  return static_cast<int8_t>(r > 127.0f ? 127.0f : (r < -127.0f ? -127.0f : r));
}

}  // namespace

uint16_t FloatToHalfBits(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  x &= 0x7FFFFFFFu;
  if (x > 0x7F800000u) return sign | 0x7E00u;  // NaN (quiet)
  // 65520 and above round to infinity (65504, the largest half, has an odd mantissa).
  if (x >= 0x477FF000u) return sign | 0x7C00u;
  if (x >= 0x38800000u) {  // normal half: rebias the exponent, round the mantissa to 10 bits
    const uint32_t bits = ((x - 0x38000000u) >> 13);
    const uint32_t rest = x & 0x1FFFu;
    const uint32_t up = rest > 0x1000u || (rest == 0x1000u && (bits & 1u));
    return static_cast<uint16_t>(sign | (bits + up));  // a carry moves into the exponent
  }
  // Subnormal half: value / 2^-24 rounded to nearest even; float subnormals are below its range.
  const uint32_t exp = x >> 23;
  if (exp < 102) return sign;  // below 2^-25: rounds to zero
  const uint32_t mant = (x & 0x7FFFFFu) | 0x800000u;
  const uint32_t shift = 126 - exp;  // 14..24
  const uint32_t q = mant >> shift, rest = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
  const uint32_t up = rest > half || (rest == half && (q & 1u));
  return static_cast<uint16_t>(sign | (q + up));
}

bool QuantizeRowQ8(const float* x, int64_t blocks, bool with_sums, const Q8Row& out) {
  for (int64_t b = 0; b < blocks; ++b) {
    const float* xb = x + b * kBlock;
    float amax = 0;
    bool finite = true;
    for (int i = 0; i < kBlock; ++i) {
      const float a = std::fabs(xb[i]);
      finite &= a <= 3.402823466e38f;  // false for inf and NaN
      amax = amax > a ? amax : a;
    }
    if (!finite) return false;
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const uint16_t dh = FloatToHalfBits(d);
    if ((dh & 0x7C00u) == 0x7C00u) return false;
    int8_t* q = out.qs + b * kBlock;
    int32_t sum = 0;
    for (int i = 0; i < kBlock; ++i) {
      q[i] = RoundToInt8(xb[i] * id);
      sum += q[i];
    }
    out.d[b] = HalfBitsToFloat(dh);
    out.qsum[b] = sum;
    if (with_sums) {
      const uint16_t sh = FloatToHalfBits(static_cast<float>(sum) * d);
      if ((sh & 0x7C00u) == 0x7C00u) return false;
      out.s[b] = HalfBitsToFloat(sh);
    }
  }
  return true;
}

void DotRowsInt8Portable(const Int8DotArgs& a) {
  const bool q41 = a.type == WeightType::kQ4_1;
  for (int64_t j = 0; j < a.n; ++j) {
    const uint8_t* row = a.w + j * a.row_bytes;
    float sum = 0;
    for (int64_t b = 0; b < a.blocks; ++b) {
      const int8_t* xq = a.xq + b * kBlock;
      int32_t sumi = 0;
      if (a.type == WeightType::kQ8_0) {
        const uint8_t* blk = row + b * 34;
        for (int i = 0; i < kBlock; ++i) sumi += static_cast<int8_t>(blk[2 + i]) * xq[i];
        sum += static_cast<float>(sumi) * (Half(blk) * a.xd[b]);
        continue;
      }
      const uint8_t* blk = row + b * (q41 ? 20 : 18);
      const uint8_t* qs = blk + (q41 ? 4 : 2);
      const int offset = q41 ? 0 : 8;  // Q4_0 stores n - 8
      for (int i = 0; i < 16; ++i) {
        sumi += ((qs[i] & 0x0F) - offset) * xq[i];
        sumi += ((qs[i] >> 4) - offset) * xq[i + 16];
      }
      if (q41) {
        sum += (Half(blk) * a.xd[b]) * static_cast<float>(sumi) + Half(blk + 2) * a.xs[b];
      } else {
        sum += static_cast<float>(sumi) * (Half(blk) * a.xd[b]);
      }
    }
    a.y[j] = a.accumulate ? a.y[j] + sum : sum;
  }
}

}  // namespace lazyattn::quant_internal
