#include "kernels/cpu/half_rows.h"

#include <immintrin.h>

#include <cstring>

#include "kernels/cpu/quant_dot.h"
#include "kernels/include/quant_linear.h"

#define LAZYATTN_F16C __attribute__((target("avx2,f16c")))

namespace lazyattn::cpu_internal {
namespace {

bool UseF16c() {
  static const bool f16c = CpuSupportsIsa(CpuIsa::kAvx2);
  return f16c;
}

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

}  // namespace

// Round to nearest even without a table (F. Giesen's float_to_half_fast3_rtne): subnormal halves
// by adding a magic float so the FPU's own rounding does it, normal ones by a rounding bias.
uint16_t FloatToHalfBits(float f) {
  constexpr uint32_t kF32Inf = 255u << 23, kF16Max = (127u + 16) << 23;
  constexpr uint32_t kDenormMagic = ((127u - 15) + (23 - 10) + 1) << 23;
  uint32_t u = Bits(f);
  const uint32_t sign = u & 0x80000000u;
  u ^= sign;
  uint16_t out;
  if (u >= kF16Max) {
    out = u > kF32Inf ? 0x7e00 : 0x7c00;  // NaN stays a (quiet) NaN; too large: inf
  } else if (u < (113u << 23)) {
    out = static_cast<uint16_t>(Bits(FromBits(u) + FromBits(kDenormMagic)) - kDenormMagic);
  } else {
    const uint32_t mant_odd = (u >> 13) & 1;
    u += ((15u - 127u) << 23) + 0xfff;
    u += mant_odd;
    out = static_cast<uint16_t>(u >> 13);
  }
  return static_cast<uint16_t>(out | (sign >> 16));
}

float HalfBitsToFloatValue(uint16_t h) { return quant_internal::HalfBitsToFloat(h); }

void HalfToFloatRowPortable(const uint16_t* src, int64_t n, float* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = quant_internal::HalfBitsToFloat(src[i]);
}

void FloatToHalfRowPortable(const float* src, int64_t n, uint16_t* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = FloatToHalfBits(src[i]);
}

LAZYATTN_F16C void HalfToFloatRowF16c(const uint16_t* src, int64_t n, float* dst) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(dst + i,
                     _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  }
  for (; i < n; ++i) dst[i] = _cvtsh_ss(src[i]);
}

LAZYATTN_F16C void FloatToHalfRowF16c(const float* src, int64_t n, uint16_t* dst) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
  }
  for (; i < n; ++i) dst[i] = _cvtss_sh(src[i], _MM_FROUND_TO_NEAREST_INT);
}

void HalfToFloatRow(const uint16_t* src, int64_t n, float* dst) {
  if (UseF16c()) {
    HalfToFloatRowF16c(src, n, dst);
  } else {
    HalfToFloatRowPortable(src, n, dst);
  }
}

void FloatToHalfRow(const float* src, int64_t n, uint16_t* dst) {
  if (UseF16c()) {
    FloatToHalfRowF16c(src, n, dst);
  } else {
    FloatToHalfRowPortable(src, n, dst);
  }
}

}  // namespace lazyattn::cpu_internal
