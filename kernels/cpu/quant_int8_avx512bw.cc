// AVX-512 F + BW int8 dot products (quant_int8_avx512.inc); called only where the CPU has them
// (CpuSupportsIsa).
#define LAZYATTN_TARGET __attribute__((target("avx512f,avx512bw,avx2,fma,f16c")))
#define LAZYATTN_VNNI 0

#include "kernels/cpu/quant_int8_avx512.inc"

namespace lazyattn::quant_internal {
LAZYATTN_TARGET void DotRowsInt8Avx512Bw(const Int8DotArgs& a) { Dispatch(a); }
}  // namespace lazyattn::quant_internal
