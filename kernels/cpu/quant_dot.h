// Internal to the quantized linear kernels (quant_linear.h): the per-ISA dot-product loops.
#ifndef LAZYATTN_KERNELS_CPU_QUANT_DOT_H_
#define LAZYATTN_KERNELS_CPU_QUANT_DOT_H_

#include <cstddef>
#include <cstdint>

#include "kernels/include/quant_linear.h"

namespace lazyattn::quant_internal {

inline constexpr int64_t kBlock = 32;  // values per Q8_0 / Q4_0 / Q4_1 block

// y[j] (+)= W[j] . x for the n rows starting at `w` (row_bytes apart), fp32 accumulation.
// x_block_sums[b] = sum of x over block b (read for Q4_0 and Q4_1 only).
struct DotArgs {
  WeightType type;
  const uint8_t* w;
  size_t row_bytes;
  int64_t n;
  int64_t cols;
  const float* x;
  const float* x_block_sums;
  float* y;
  bool accumulate;
};

void DotRowsPortable(const DotArgs& a);
void DotRowsAvx2(const DotArgs& a);  // only where the CPU has AVX2, FMA and F16C

// `count` values of a block type (Q8_0, Q4_0, Q4_1) at `src` into fp32, bit for bit as the
// portable conversion; false (nothing written) for other types. AVX2 CPUs only.
bool DequantizeAvx2(WeightType type, const uint8_t* src, int64_t count, float* dst);

// IEEE half and bfloat16 bits to float (portable).
float HalfBitsToFloat(uint16_t h);
inline float Bf16BitsToFloat(uint16_t b) {
  const uint32_t bits = uint32_t{b} << 16;
  float f;
  __builtin_memcpy(&f, &bits, sizeof f);
  return f;
}

}  // namespace lazyattn::quant_internal

#endif  // LAZYATTN_KERNELS_CPU_QUANT_DOT_H_
