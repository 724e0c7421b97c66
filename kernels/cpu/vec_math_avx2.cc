// AVX2 + FMA forms of vec_math.h. Every function carries the target attribute instead of the file
// being built with -mavx2 (as quant_dot_avx2.cc), so no AVX2 code reaches a CPU without it.
#include <immintrin.h>

#include "kernels/cpu/avx2_sum.h"
#include "kernels/cpu/vec_math.h"

#define LAZYATTN_AVX2 __attribute__((target("avx2,fma")))

namespace lazyattn::cpu_internal {
namespace {

// Cephes expf: n = round(x / ln 2), r = x - n ln 2 (ln 2 in two parts so r is exact), exp(r) by a
// degree-5 polynomial, times 2^n built in the exponent bits. The clamp keeps 2^n normal; min and
// max take x as their second operand so a NaN passes through.
LAZYATTN_AVX2 inline __m256 Exp(__m256 x) {
  x = _mm256_min_ps(_mm256_set1_ps(88.7228317f), x);
  x = _mm256_max_ps(_mm256_set1_ps(-87.3365447505531f), x);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  // 2^n for n in [-126, 127]; near ln(FLT_MAX) n is 128: split it as 2^(n-1) * 2.
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m256i big = _mm256_cmpgt_epi32(ni, _mm256_set1_epi32(127));
  const __m256i e = _mm256_sub_epi32(ni, _mm256_and_si256(big, _mm256_set1_epi32(1)));
  const __m256 pow2 =
      _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(e, _mm256_set1_epi32(127)), 23));
  p = _mm256_mul_ps(p, pow2);
  return _mm256_blendv_ps(p, _mm256_add_ps(p, p), _mm256_castsi256_ps(big));
}

// The first `n` (< 8) lanes: all ones in their mask, zeros in the others.
LAZYATTN_AVX2 inline __m256i TailMask(int64_t n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

LAZYATTN_AVX2 inline __m256 SiluMul8(__m256 g, __m256 u) {
  const __m256 den =
      _mm256_add_ps(_mm256_set1_ps(1.0f), Exp(_mm256_sub_ps(_mm256_setzero_ps(), g)));
  return _mm256_mul_ps(_mm256_div_ps(g, den), u);
}

}  // namespace

LAZYATTN_AVX2 double ExpShiftSumAvx2(float* x, int64_t n, float shift) {
  const __m256 s = _mm256_set1_ps(shift);
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 e = Exp(_mm256_sub_ps(_mm256_loadu_ps(x + i), s));
    _mm256_storeu_ps(x + i, e);
    acc = _mm256_add_ps(acc, e);
  }
  if (i < n) {
    const __m256i m = TailMask(n - i);
    const __m256 e = Exp(_mm256_sub_ps(_mm256_maskload_ps(x + i, m), s));
    _mm256_maskstore_ps(x + i, m, e);
    acc = _mm256_add_ps(acc, _mm256_and_ps(e, _mm256_castsi256_ps(m)));
  }
  return HorizontalSum(acc);
}

LAZYATTN_AVX2 void SiluMulAvx2(const float* g, const float* u, int64_t n, float* out) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(out + i, SiluMul8(_mm256_loadu_ps(g + i), _mm256_loadu_ps(u + i)));
  }
  if (i < n) {
    const __m256i m = TailMask(n - i);
    _mm256_maskstore_ps(out + i, m,
                        SiluMul8(_mm256_maskload_ps(g + i, m), _mm256_maskload_ps(u + i, m)));
  }
}

}  // namespace lazyattn::cpu_internal
