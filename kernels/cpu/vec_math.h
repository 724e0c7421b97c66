// Element-wise math of the CPU kernels (softmax exponentials, SiLU), vectorized where the CPU
// allows: AVX2 + FMA when CpuSupportsIsa(kAvx2) (checked once), a portable loop otherwise.
//
// Accuracy: the AVX2 exponential is Cephes' expf (range reduction by ln 2 in two parts, a degree-5
// polynomial), within 2 ulp of the correctly rounded exp over [-87.33, 88.72] (the normal floats);
// arguments below give ~1.2e-38 instead of a subnormal or 0 (softmax weights that small add
// nothing), above they give exp(88.72) ~ 3.4e38 or inf. NaN stays NaN. The portable forms call
// std::exp.
#ifndef LAZYATTN_KERNELS_CPU_VEC_MATH_H_
#define LAZYATTN_KERNELS_CPU_VEC_MATH_H_

#include <cstdint>

namespace lazyattn::cpu_internal {

// x[i] = exp(x[i] - shift) for i < n; returns the sum of the results (portable: in double;
// AVX2: eight fp32 partial sums, relative error ~n * 2^-24 at worst, far inside the softmax's
// needs).
double ExpShiftSum(float* x, int64_t n, float shift);

// out[i] = g[i] / (1 + exp(-g[i])) * u[i] for i < n (SwiGLU); out may alias g or u.
void SiluMul(const float* g, const float* u, int64_t n, float* out);

// The portable and AVX2 forms themselves, for tests (the AVX2 ones only where the CPU has AVX2).
double ExpShiftSumPortable(float* x, int64_t n, float shift);
double ExpShiftSumAvx2(float* x, int64_t n, float shift);
void SiluMulPortable(const float* g, const float* u, int64_t n, float* out);
void SiluMulAvx2(const float* g, const float* u, int64_t n, float* out);

}  // namespace lazyattn::cpu_internal

#endif  // LAZYATTN_KERNELS_CPU_VEC_MATH_H_
