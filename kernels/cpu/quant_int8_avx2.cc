// AVX2 int8 dot products (quant_int8.h): vpmaddubsw multiplies unsigned by signed bytes into
// pairwise int16 sums (at most 2 * 15 * 127 for nibbles, 2 * 128 * 127 for Q8_0: no saturation),
// vpmaddwd folds them into eight int32 lane sums a block. Q4 nibbles are unsigned as stored (Q4_0's
// -8 goes through the block's sum of q); Q8_0 x q8_0 takes ggml's sign trick, |w| times q with w's
// sign. Every function carries the target attribute (quant_dot_avx2.cc says why).
#include <immintrin.h>

#include <cstring>

#include "kernels/cpu/avx2_sum.h"
#include "kernels/cpu/quant_dot.h"
#include "kernels/cpu/quant_int8.h"
#include "kernels/cpu/quant_int8_simd.h"

#define LAZYATTN_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace lazyattn::quant_internal {
namespace {

using cpu_internal::HorizontalSum;

// One block's eight int32 lane sums of u * s as floats.
LAZYATTN_AVX2 inline __m256 DotBlock(__m256i u, __m256i s) {
  const __m256i pairs = _mm256_maddubs_epi16(u, s);
  return _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}

// The unsigned operand of a block and, for Q8_0, the signed one with w's sign moved onto it.
LAZYATTN_AVX2 inline __m256 BlockProduct(WeightType type, const uint8_t* blk, const int8_t* xq) {
  const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq));
  if (type == WeightType::kQ8_0) {
    const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2));
    return DotBlock(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
  }
  return DotBlock(NibblesAvx2(blk + (type == WeightType::kQ4_1 ? 4 : 2)), x);
}

// One block into a vector accumulator and its scalar term: Q4_1's m * s, Q4_0's
// -8 * sum(q) * scale.
template <WeightType kType>
LAZYATTN_AVX2 inline void Step(const uint8_t* blk, const Int8DotArgs& a, int64_t b, __m256& acc,
                               float& off) {
  const float scale = _cvtsh_ss(Load16(blk)) * a.xd[b];
  acc = _mm256_fmadd_ps(_mm256_set1_ps(scale), BlockProduct(kType, blk, a.xq + b * kBlock), acc);
  if constexpr (kType == WeightType::kQ4_1) {
    off += _cvtsh_ss(Load16(blk + 2)) * a.xs[b];
  } else if constexpr (kType == WeightType::kQ4_0) {
    off += static_cast<float>(-8 * a.xqsum[b]) * scale;
  }
}

// Two blocks a step into independent accumulators (one chain would be bound by the FMA latency).
template <WeightType kType>
LAZYATTN_AVX2 float DotRow(const uint8_t* row, const Int8DotArgs& a) {
  constexpr size_t kBytes = BlockBytes(kType);
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  float off0 = 0, off1 = 0;
  int64_t b = 0;
  for (; b + 2 <= a.blocks; b += 2) {
    Step<kType>(row + b * kBytes, a, b, acc0, off0);
    Step<kType>(row + (b + 1) * kBytes, a, b + 1, acc1, off1);
  }
  if (b < a.blocks) Step<kType>(row + b * kBytes, a, b, acc0, off0);
  return HorizontalSum(_mm256_add_ps(acc0, acc1)) + (off0 + off1);
}

template <WeightType kType>
LAZYATTN_AVX2 void Rows(const Int8DotArgs& a) {
  for (int64_t j = 0; j < a.n; ++j) {
    const float v = DotRow<kType>(a.w + j * a.row_bytes, a);
    a.y[j] = a.accumulate ? a.y[j] + v : v;
  }
}

}  // namespace

LAZYATTN_AVX2 void DotRowsInt8Avx2(const Int8DotArgs& a) {
  switch (a.type) {
    case WeightType::kQ8_0:
      return Rows<WeightType::kQ8_0>(a);
    case WeightType::kQ4_0:
      return Rows<WeightType::kQ4_0>(a);
    case WeightType::kQ4_1:
      return Rows<WeightType::kQ4_1>(a);
    default:
      return;  // no int8 product (HasInt8Dot)
  }
}

}  // namespace lazyattn::quant_internal
