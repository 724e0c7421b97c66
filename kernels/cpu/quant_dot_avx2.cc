// AVX2 + FMA + F16C dot products over stored weights (quant_dot.h). Every function carries the
// target attribute instead of the file being built with -mavx2, so that no inline function this
// file instantiates can leak AVX2 code into a CPU without it; callers check CpuSupportsIsa first.
#include <immintrin.h>

#include <cstring>

#include "kernels/cpu/avx2_sum.h"
#include "kernels/cpu/quant_dot.h"

#define LAZYATTN_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace lazyattn::quant_internal {
namespace {

LAZYATTN_AVX2 inline float Half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, sizeof h);
  return _cvtsh_ss(h);
}

using cpu_internal::HorizontalSum;

// Eight unsigned / signed bytes (the low 8 of v) as floats.
LAZYATTN_AVX2 inline __m256 U8ToF32(__m128i v) {
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v));
}
LAZYATTN_AVX2 inline __m256 I8ToF32(__m128i v) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v));
}

// One Q4_0 / Q4_1 block: d * sum(q x) as 8 partial sums, and the block's offset term.
LAZYATTN_AVX2 inline __m256 BlockQ4(const uint8_t* blk, const float* xb, size_t qs) {
  const __m128i mask = _mm_set1_epi8(0x0F);
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + qs));
  const __m128i lo = _mm_and_si128(q, mask);                     // values 0..15
  const __m128i hi = _mm_and_si128(_mm_srli_epi16(q, 4), mask);  // values 16..31
  __m256 s = _mm256_mul_ps(U8ToF32(lo), _mm256_loadu_ps(xb));
  s = _mm256_fmadd_ps(U8ToF32(_mm_unpackhi_epi64(lo, lo)), _mm256_loadu_ps(xb + 8), s);
  s = _mm256_fmadd_ps(U8ToF32(hi), _mm256_loadu_ps(xb + 16), s);
  return _mm256_fmadd_ps(U8ToF32(_mm_unpackhi_epi64(hi, hi)), _mm256_loadu_ps(xb + 24), s);
}

// Two blocks a step into independent accumulators: one chain would leave the loop bound by the
// latency of its FMAs and of the scalar offset sum rather than by its throughput (measured 0.11
// ns a value with one chain).
LAZYATTN_AVX2 float DotQ4(const uint8_t* row, const float* x, const float* xs, int64_t blocks,
                          bool q41) {
  const size_t block_bytes = q41 ? 20 : 18, qs = q41 ? 4 : 2;
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  float off0 = 0, off1 = 0;
  int64_t b = 0;
  for (; b + 2 <= blocks; b += 2) {
    const uint8_t* b0 = row + b * block_bytes;
    const uint8_t* b1 = b0 + block_bytes;
    const float d0 = Half(b0), d1 = Half(b1);
    acc0 = _mm256_fmadd_ps(_mm256_set1_ps(d0), BlockQ4(b0, x + b * kBlock, qs), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_set1_ps(d1), BlockQ4(b1, x + (b + 1) * kBlock, qs), acc1);
    off0 += (q41 ? Half(b0 + 2) : -8.0f * d0) * xs[b];
    off1 += (q41 ? Half(b1 + 2) : -8.0f * d1) * xs[b + 1];
  }
  if (b < blocks) {
    const uint8_t* b0 = row + b * block_bytes;
    const float d0 = Half(b0);
    acc0 = _mm256_fmadd_ps(_mm256_set1_ps(d0), BlockQ4(b0, x + b * kBlock, qs), acc0);
    off0 += (q41 ? Half(b0 + 2) : -8.0f * d0) * xs[b];
  }
  return HorizontalSum(_mm256_add_ps(acc0, acc1)) + (off0 + off1);
}

LAZYATTN_AVX2 inline __m256 BlockQ8(const uint8_t* q, const float* xb) {
  __m256 s = _mm256_mul_ps(I8ToF32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q))),
                           _mm256_loadu_ps(xb));
  for (int i = 1; i < 4; ++i) {
    s = _mm256_fmadd_ps(I8ToF32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + 8 * i))),
                        _mm256_loadu_ps(xb + 8 * i), s);
  }
  return s;
}

LAZYATTN_AVX2 float DotQ8(const uint8_t* row, const float* x, int64_t blocks) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t b = 0;
  for (; b + 2 <= blocks; b += 2) {
    const uint8_t* b0 = row + b * 34;
    acc0 = _mm256_fmadd_ps(_mm256_set1_ps(Half(b0)), BlockQ8(b0 + 2, x + b * kBlock), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_set1_ps(Half(b0 + 34)), BlockQ8(b0 + 36, x + (b + 1) * kBlock),
                           acc1);
  }
  if (b < blocks) {
    const uint8_t* b0 = row + b * 34;
    acc0 = _mm256_fmadd_ps(_mm256_set1_ps(Half(b0)), BlockQ8(b0 + 2, x + b * kBlock), acc0);
  }
  return HorizontalSum(_mm256_add_ps(acc0, acc1));
}

// fp32 / fp16 / bf16 rows: 8 values a step, the tail (cols % 8) in scalar.
LAZYATTN_AVX2 float DotFloat(WeightType type, const uint8_t* row, const float* x, int64_t cols) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  auto load8 = [type, row](int64_t k) LAZYATTN_AVX2 {
    if (type == WeightType::kF32) return _mm256_loadu_ps(reinterpret_cast<const float*>(row) + k);
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * k));
    if (type == WeightType::kF16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  };
  int64_t k = 0;
  for (; k + 16 <= cols; k += 16) {
    acc0 = _mm256_fmadd_ps(load8(k), _mm256_loadu_ps(x + k), acc0);
    acc1 = _mm256_fmadd_ps(load8(k + 8), _mm256_loadu_ps(x + k + 8), acc1);
  }
  if (k + 8 <= cols) {
    acc0 = _mm256_fmadd_ps(load8(k), _mm256_loadu_ps(x + k), acc0);
    k += 8;
  }
  float sum = HorizontalSum(_mm256_add_ps(acc0, acc1));
  for (; k < cols; ++k) {
    float w;
    if (type == WeightType::kF32) {
      std::memcpy(&w, row + 4 * k, sizeof w);
    } else {
      uint16_t h;
      std::memcpy(&h, row + 2 * k, sizeof h);
      w = type == WeightType::kF16 ? _cvtsh_ss(h) : Bf16BitsToFloat(h);
    }
    sum += w * x[k];
  }
  return sum;
}

}  // namespace

LAZYATTN_AVX2 void DotRowsAvx2(const DotArgs& a) {
  const int64_t blocks = a.cols / kBlock;
  for (int64_t j = 0; j < a.n; ++j) {
    const uint8_t* row = a.w + j * a.row_bytes;
    float v;
    switch (a.type) {
      case WeightType::kQ4_0:
        v = DotQ4(row, a.x, a.x_block_sums, blocks, false);
        break;
      case WeightType::kQ4_1:
        v = DotQ4(row, a.x, a.x_block_sums, blocks, true);
        break;
      case WeightType::kQ8_0:
        v = DotQ8(row, a.x, blocks);
        break;
      default:
        v = DotFloat(a.type, row, a.x, a.cols);
        break;
    }
    a.y[j] = a.accumulate ? a.y[j] + v : v;
  }
}

// Same values as the portable DequantizeRowsCpu, bit for bit: products and sums rounded
// separately (no FMA), as ggml's formulas.
LAZYATTN_AVX2 bool DequantizeAvx2(WeightType type, const uint8_t* src, int64_t count, float* dst) {
  const int64_t blocks = count / kBlock;
  switch (type) {
    case WeightType::kQ4_0:
    case WeightType::kQ4_1: {
      const bool q41 = type == WeightType::kQ4_1;
      const size_t block_bytes = q41 ? 20 : 18, qs = q41 ? 4 : 2;
      const __m128i mask = _mm_set1_epi8(0x0F);
      const __m256i eight = _mm256_set1_epi32(8);
      for (int64_t b = 0; b < blocks; ++b) {
        const uint8_t* blk = src + b * block_bytes;
        const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + qs));
        const __m128i lo = _mm_and_si128(q, mask), hi = _mm_and_si128(_mm_srli_epi16(q, 4), mask);
        const __m128i parts[4] = {lo, _mm_unpackhi_epi64(lo, lo), hi, _mm_unpackhi_epi64(hi, hi)};
        const __m256 d = _mm256_set1_ps(Half(blk));
        const __m256 m = _mm256_set1_ps(q41 ? Half(blk + 2) : 0.0f);
        for (int i = 0; i < 4; ++i) {
          __m256i v = _mm256_cvtepu8_epi32(parts[i]);
          __m256 out;
          if (q41) {
            out = _mm256_add_ps(_mm256_mul_ps(d, _mm256_cvtepi32_ps(v)), m);
          } else {
            out = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_sub_epi32(v, eight)));
          }
          _mm256_storeu_ps(dst + b * kBlock + 8 * i, out);
        }
      }
      return true;
    }
    case WeightType::kQ8_0:
      for (int64_t b = 0; b < blocks; ++b) {
        const uint8_t* blk = src + b * 34;
        const __m256 d = _mm256_set1_ps(Half(blk));
        for (int i = 0; i < 4; ++i) {
          const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + 2 + 8 * i));
          _mm256_storeu_ps(dst + b * kBlock + 8 * i, _mm256_mul_ps(d, I8ToF32(q)));
        }
      }
      return true;
    default:
      return false;
  }
}

}  // namespace lazyattn::quant_internal
