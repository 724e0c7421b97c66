// AVX2 + FMA + F16C forms of decode_rows.h. The group size is a template parameter (1 to 8) so
// its accumulators stay in registers. Every function carries the target attribute (as
// quant_dot_avx2.cc): no AVX2 code reaches a CPU without it.
#include <immintrin.h>

#include "kernels/cpu/avx2_sum.h"
#include "kernels/cpu/decode_rows.h"

#define LAZYATTN_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace lazyattn::cpu_internal {
namespace {

LAZYATTN_AVX2 inline __m256 Load8(const KvRows& r, int64_t offset) {
  if (r.f32 != nullptr) return _mm256_loadu_ps(r.f32 + offset);
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(r.f16 + offset)));
}

template <int G>
LAZYATTN_AVX2 void Scores(const float* q, int d, float scale, const KvRows& k, float* scores) {
  for (int64_t j = 0; j < k.rows; ++j) {
    __m256 acc[G];
    for (int g = 0; g < G; ++g) acc[g] = _mm256_setzero_ps();
    for (int x = 0; x < d; x += 8) {
      const __m256 kv = Load8(k, j * d + x);
      for (int g = 0; g < G; ++g) {
        acc[g] = _mm256_fmadd_ps(_mm256_loadu_ps(q + g * d + x), kv, acc[g]);
      }
    }
    for (int g = 0; g < G; ++g) scores[j * G + g] = HorizontalSum(acc[g]) * scale;
  }
}

// Columns of the accumulators kept in registers across all rows: G x kVecs vectors (at most 12
// of the 16), so each is loaded and stored once per block instead of once per row.
template <int G>
LAZYATTN_AVX2 void Accumulate(const float* p, int d, const KvRows& v, float* acc) {
  constexpr int kVecs = G <= 3 ? 4 : (G <= 6 ? 2 : 1);
  int x0 = 0;
  for (; x0 + 8 * kVecs <= d; x0 += 8 * kVecs) {
    __m256 a[G][kVecs];
    for (int g = 0; g < G; ++g) {
      for (int c = 0; c < kVecs; ++c) a[g][c] = _mm256_loadu_ps(acc + g * d + x0 + 8 * c);
    }
    for (int64_t j = 0; j < v.rows; ++j) {
      for (int c = 0; c < kVecs; ++c) {
        const __m256 vv = Load8(v, j * d + x0 + 8 * c);
        for (int g = 0; g < G; ++g) {
          a[g][c] = _mm256_fmadd_ps(_mm256_set1_ps(p[j * G + g]), vv, a[g][c]);
        }
      }
    }
    for (int g = 0; g < G; ++g) {
      for (int c = 0; c < kVecs; ++c) _mm256_storeu_ps(acc + g * d + x0 + 8 * c, a[g][c]);
    }
  }
  for (; x0 < d; x0 += 8) {  // d a multiple of 8 but not of 8 * kVecs
    __m256 a[G];
    for (int g = 0; g < G; ++g) a[g] = _mm256_loadu_ps(acc + g * d + x0);
    for (int64_t j = 0; j < v.rows; ++j) {
      const __m256 vv = Load8(v, j * d + x0);
      for (int g = 0; g < G; ++g) a[g] = _mm256_fmadd_ps(_mm256_set1_ps(p[j * G + g]), vv, a[g]);
    }
    for (int g = 0; g < G; ++g) _mm256_storeu_ps(acc + g * d + x0, a[g]);
  }
}

}  // namespace

LAZYATTN_AVX2 void ScoreRowsAvx2(const float* q, int group, int d, float scale, const KvRows& k,
                                 float* scores) {
  switch (group) {
    case 1:
      return Scores<1>(q, d, scale, k, scores);
    case 2:
      return Scores<2>(q, d, scale, k, scores);
    case 3:
      return Scores<3>(q, d, scale, k, scores);
    case 4:
      return Scores<4>(q, d, scale, k, scores);
    case 5:
      return Scores<5>(q, d, scale, k, scores);
    case 6:
      return Scores<6>(q, d, scale, k, scores);
    case 7:
      return Scores<7>(q, d, scale, k, scores);
    case 8:
      return Scores<8>(q, d, scale, k, scores);
    default:
      return;  // decode_rows.cc sends other groups to the portable form
  }
}

LAZYATTN_AVX2 void AccumulateRowsAvx2(const float* p, int group, int d, const KvRows& v,
                                      float* acc) {
  switch (group) {
    case 1:
      return Accumulate<1>(p, d, v, acc);
    case 2:
      return Accumulate<2>(p, d, v, acc);
    case 3:
      return Accumulate<3>(p, d, v, acc);
    case 4:
      return Accumulate<4>(p, d, v, acc);
    case 5:
      return Accumulate<5>(p, d, v, acc);
    case 6:
      return Accumulate<6>(p, d, v, acc);
    case 7:
      return Accumulate<7>(p, d, v, acc);
    case 8:
      return Accumulate<8>(p, d, v, acc);
    default:
      return;
  }
}

}  // namespace lazyattn::cpu_internal
