// Internal to the quantized linear kernels (quant_linear.h): decode products with 8-bit
// activations (CpuActivations::kInt8).
//
// An activation row is quantized per 32-value block with ggml's reference formula
// (quantize_row_q8_0_ref / quantize_row_q8_1_ref, which agree on everything but q8_1's sum):
//   amax = max |x|,  d = amax / 127,  id = d ? 1 / d : 0,  q = roundf(x * id) (half away from 0),
//   d stored as fp16 (round to nearest even),  q8_1 only: s = fp16(d * sum(q)) with the fp32 d.
// A block of weights then multiplies its stored integers by q into an exact int32 sum:
//   Q8_0 x q8_0: sumi = sum(w q),        y += sumi * (d_w * d)
//   Q4_0 x q8_0: sumi = sum((n - 8) q),  y += sumi * (d_w * d)   (n: the unsigned nibble)
//   Q4_1 x q8_1: sumi = sum(n q),        y += (d_w * d) * sumi + m_w * s
// and blocks accumulate in fp32 (ggml's vec_dot_q*_q8_* formulas). The SIMD variants compute the
// same integer sums; their fp32 arithmetic differs from the portable one in the order of the
// additions and, for Q4_0, in its form (d * sum(n q) - 8 d * sum(q) instead of d * sum((n - 8) q)),
// so results agree to rounding, not bit for bit.
#ifndef LAZYATTN_KERNELS_CPU_QUANT_INT8_H_
#define LAZYATTN_KERNELS_CPU_QUANT_INT8_H_

#include <cstddef>
#include <cstdint>

#include "kernels/include/quant_linear.h"

namespace lazyattn::quant_internal {

// One quantized activation row of `blocks` blocks, as arrays (contiguous int8 values make the
// SIMD loads plain): qs[32 * blocks], and per block d, s and the integer sum of its qs.
// d and s hold the fp16 values ggml stores, widened to float.
struct Q8Row {
  int8_t* qs;
  float* d;
  float* s;
  int32_t* qsum;
};

// IEEE float to half bits, round to nearest even, overflow to infinity, NaN kept a NaN (what
// F16C's vcvtps2ph and ggml's GGML_FP32_TO_FP16 do).
uint16_t FloatToHalfBits(float f);

// Quantizes `blocks` blocks of x into `out` with the formula above. Every q lands in [-127, 127]
// whatever the input (a tiny block whose 1 / d overflows gives +-127 and 0, where the formula
// itself has no defined value; its fp16 d is 0). Returns false when a block holds a non-finite
// value, or when its d (or, with `with_sums`, its s) is too large for fp16 (|x| beyond
// 65504 * 127, or |sum(x)| beyond ~65504): the caller keeps fp32 activations for that row, so the
// int8 path never turns an inf, a NaN or a huge value into something else. `out` is then partly
// written and must not be used.
bool QuantizeRowQ8(const float* x, int64_t blocks, bool with_sums, const Q8Row& out);

// y[j] (+)= W[j] . x for the n weight rows starting at `w` (row_bytes apart), x quantized.
struct Int8DotArgs {
  WeightType type;  // kQ8_0, kQ4_0 or kQ4_1
  const uint8_t* w;
  size_t row_bytes;
  int64_t n;
  int64_t blocks;
  const int8_t* xq;
  const float* xd;
  const float* xs;       // Q4_1 only
  const int32_t* xqsum;  // Q4_0 only (the SIMD variants fold its -8 offset through it)
  float* y;
  bool accumulate;
};

void DotRowsInt8Portable(const Int8DotArgs& a);
void DotRowsInt8Avx2(const Int8DotArgs& a);        // AVX2 + FMA + F16C
void DotRowsInt8Avx512Bw(const Int8DotArgs& a);    // and AVX-512 F + BW
void DotRowsInt8Avx512Vnni(const Int8DotArgs& a);  // and AVX-512 VNNI

// Whether `type` has an int8-activation product (the block types).
inline bool HasInt8Dot(WeightType type) {
  return type == WeightType::kQ8_0 || type == WeightType::kQ4_0 || type == WeightType::kQ4_1;
}

}  // namespace lazyattn::quant_internal

#endif  // LAZYATTN_KERNELS_CPU_QUANT_INT8_H_
