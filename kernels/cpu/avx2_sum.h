// Internal to the CPU kernels' AVX2 files: the horizontal sum of eight floats, which the dot
// products, the decode attention rows and the vectorized math all end with. It carries the AVX2
// target attribute, so it is only ever called from those files' AVX2 functions, which the CPU
// checks guard (CpuSupportsIsa).
#ifndef LAZYATTN_KERNELS_CPU_AVX2_SUM_H_
#define LAZYATTN_KERNELS_CPU_AVX2_SUM_H_

#include <immintrin.h>

namespace lazyattn::cpu_internal {

// v[0] + ... + v[7], added as (lo + hi) pairwise: the same order in every caller.
__attribute__((target("avx2"))) inline float HorizontalSum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

}  // namespace lazyattn::cpu_internal

#endif  // LAZYATTN_KERNELS_CPU_AVX2_SUM_H_
