// The arithmetic of one RMSNorm row over an fp32 input, shared by the norm kernel
// (rms_norm.cu) and the one-row linear kernel that normalizes its own input
// (skinny_linear.cu). Both must produce the same bf16 values bit for bit, so a fused step
// equals an unfused one exactly: same thread count, same element-to-thread assignment
// (float4 i to thread i mod kRmsNormThreads, in increasing i), same expressions.
#ifndef LAZYATTN_KERNELS_CUDA_RMS_NORM_ROW_CUH_
#define LAZYATTN_KERNELS_CUDA_RMS_NORM_ROW_CUH_

#include <cuda_bf16.h>

#include <cstdint>

namespace lazyattn {

constexpr int kRmsNormThreads = 256;

__device__ __forceinline__ float SumSquares4(float4 t) {
  return t.x * t.x + t.y * t.y + t.z * t.z + t.w * t.w;
}

// The CTA's sum of v, in a fixed order (warp butterflies, then warps 0..7). Every thread gets
// it. Must be reached by all kRmsNormThreads threads.
__device__ __forceinline__ float RmsNormBlockSum(float v) {
  __shared__ float partial[kRmsNormThreads / 32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = v;
  __syncthreads();
  float total = 0.f;
#pragma unroll
  for (int w = 0; w < kRmsNormThreads / 32; ++w) total += partial[w];
  return total;
}

__device__ __forceinline__ float RmsNormInverse(float sum_sq, int dim, float eps) {
  return rsqrtf(sum_sq / dim + eps);
}

// bf16(t * inv * weight) for 4 elements; `weight_bits` holds their 4 bf16 weights.
__device__ __forceinline__ uint2 RmsNormScale4(float4 t, float inv, uint2 weight_bits) {
  const float2 w01 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&weight_bits.x));
  const float2 w23 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&weight_bits.y));
  const __nv_bfloat162 o01 = __floats2bfloat162_rn(t.x * inv * w01.x, t.y * inv * w01.y);
  const __nv_bfloat162 o23 = __floats2bfloat162_rn(t.z * inv * w23.x, t.w * inv * w23.y);
  uint2 bits;
  bits.x = *reinterpret_cast<const uint32_t*>(&o01);
  bits.y = *reinterpret_cast<const uint32_t*>(&o23);
  return bits;
}

}  // namespace lazyattn

#endif  // LAZYATTN_KERNELS_CUDA_RMS_NORM_ROW_CUH_
