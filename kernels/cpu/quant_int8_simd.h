// Internal to the x86 int8 dot products (quant_int8_avx2.cc, quant_int8_avx512.cc): helpers both
// use. Each carries the AVX2 target attribute, so it is only ever called from those files'
// functions, which the CPU checks guard (CpuSupportsIsa).
#ifndef LAZYATTN_KERNELS_CPU_QUANT_INT8_SIMD_H_
#define LAZYATTN_KERNELS_CPU_QUANT_INT8_SIMD_H_

#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/include/quant_linear.h"

namespace lazyattn::quant_internal {

inline uint16_t Load16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

constexpr size_t BlockBytes(WeightType type) {
  return type == WeightType::kQ8_0 ? 34 : (type == WeightType::kQ4_1 ? 20 : 18);
}

// A Q4 block's 16 bytes of nibbles as its 32 unsigned values in order: byte i holds value i (low
// nibble) and value i + 16 (high).
__attribute__((target("avx2"))) inline __m256i NibblesAvx2(const uint8_t* p) {
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m256i both = _mm256_inserti128_si256(_mm256_castsi128_si256(q), _mm_srli_epi16(q, 4), 1);
  return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
}

}  // namespace lazyattn::quant_internal

#endif  // LAZYATTN_KERNELS_CPU_QUANT_INT8_SIMD_H_
