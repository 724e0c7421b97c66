// IEEE half <-> fp32 conversion of rows, for the F16 KV pools (paged_attention.h): F16C's
// vcvtph2ps / vcvtps2ph where CpuSupportsIsa(kAvx2) (which requires F16C), portable code otherwise
// (one value at a time: quant_internal's FloatToHalfBits / HalfBitsToFloat, which the quantized
// kernels share), the same bits either way: round to nearest even, |x| >= 65520 becomes +-inf,
// |x| <= 2^-25 (signed) zero, and NaN stays NaN.
#ifndef LAZYATTN_KERNELS_CPU_HALF_ROWS_H_
#define LAZYATTN_KERNELS_CPU_HALF_ROWS_H_

#include <cstdint>

namespace lazyattn::cpu_internal {

void HalfToFloatRow(const uint16_t* src, int64_t n, float* dst);
void FloatToHalfRow(const float* src, int64_t n, uint16_t* dst);

// The forms themselves, for tests (the F16C ones only where CpuSupportsIsa(kAvx2)).
void HalfToFloatRowPortable(const uint16_t* src, int64_t n, float* dst);
void FloatToHalfRowPortable(const float* src, int64_t n, uint16_t* dst);
void HalfToFloatRowF16c(const uint16_t* src, int64_t n, float* dst);
void FloatToHalfRowF16c(const float* src, int64_t n, uint16_t* dst);

}  // namespace lazyattn::cpu_internal

#endif  // LAZYATTN_KERNELS_CPU_HALF_ROWS_H_
