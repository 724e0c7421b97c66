#include "kernels/cpu/half_rows.h"

#include <immintrin.h>

#include "kernels/cpu/quant_dot.h"
#include "kernels/cpu/quant_int8.h"
#include "kernels/include/quant_linear.h"

#define LAZYATTN_F16C __attribute__((target("avx2,f16c")))

namespace lazyattn::cpu_internal {
namespace {

bool UseF16c() {
  static const bool f16c = CpuSupportsIsa(CpuIsa::kAvx2);
  return f16c;
}

}  // namespace

void HalfToFloatRowPortable(const uint16_t* src, int64_t n, float* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = quant_internal::HalfBitsToFloat(src[i]);
}

void FloatToHalfRowPortable(const float* src, int64_t n, uint16_t* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = quant_internal::FloatToHalfBits(src[i]);
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
