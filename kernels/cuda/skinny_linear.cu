#include "kernels/cuda/skinny_linear.h"

#include <limits>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch_overlap.cuh"

namespace lazyattn {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kWarpsPerCta = 8;  // one output feature per warp
constexpr int kThreads = kWarpsPerCta * 32;
// 16-byte weight loads each lane issues before using the first, and the CTAs per SM its
// register cap allows: 8 loads at 4 CTAs, or 4 loads at 6 CTAs (both ~100 KB in flight per SM
// when the SMs are full). The second is for grids that fit one wave only at 6 CTAs per SM (the
// 4096 -> 6144 qkv projection, 768 CTAs on 132 SMs): a second, partial wave costs more than the
// shallower pipeline.
constexpr int kDeepLoads = 8, kDeepCtasPerSm = 4;
constexpr int kWideLoads = 4, kWideCtasPerSm = 6;
// The gate/up form loads two rows at kWideLoads each: as many registers as kDeepLoads.
constexpr int CtasPerSm(int loads, bool swiglu) {
  return loads * (swiglu ? 2 : 1) == kDeepLoads ? kDeepCtasPerSm : kWideCtasPerSm;
}

// Weights are read once per step: keep them out of L1, where x is reused by every warp.
__device__ __forceinline__ uint4 LoadWeights(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__device__ __forceinline__ float Dot8(uint4 a, uint4 b, float acc) {
  const auto* pa = reinterpret_cast<const __nv_bfloat162*>(&a);
  const auto* pb = reinterpret_cast<const __nv_bfloat162*>(&b);
  float odd = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 fa = __bfloat1622float2(pa[i]), fb = __bfloat1622float2(pb[i]);
    acc = fmaf(fa.x, fb.x, acc);
    odd = fmaf(fa.y, fb.y, odd);
  }
  return acc + odd;
}

__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__device__ __forceinline__ float ToFloat(float v) { return v; }
__device__ __forceinline__ float ToFloat(bf16 v) { return __bfloat162float(v); }
__device__ __forceinline__ void Store(float* p, float v) { *p = v; }
__device__ __forceinline__ void Store(bf16* p, float v) { *p = __float2bfloat16_rn(v); }

// Warp n computes feature n: with kSwiGlu, features n (gate) and out + n (up), and writes
// silu(gate) * up. `in_chunks` = in / 8, the 16-byte pieces of a row.
template <int kLoadsInFlight, bool kSwiGlu, typename OutT>
__global__ void __launch_bounds__(kThreads, CtasPerSm(kLoadsInFlight, kSwiGlu))
    SkinnyLinearKernel(const bf16* __restrict__ x, const bf16* __restrict__ w, int in_chunks,
                       int out, OutT* __restrict__ y, bool accumulate) {
  constexpr int kMats = kSwiGlu ? 2 : 1;
  const int lane = threadIdx.x % 32;
  const int n = blockIdx.x * kWarpsPerCta + threadIdx.x / 32;
  if (n >= out) {
    WaitForPrerequisiteGrid();
    AllowDependentLaunch();
    return;
  }
  const uint4* w_row[kMats];
  w_row[0] = reinterpret_cast<const uint4*>(w) + int64_t{n} * in_chunks;
  if constexpr (kSwiGlu) w_row[kMats - 1] = w_row[0] + int64_t{out} * in_chunks;
  const uint4* x_chunks = reinterpret_cast<const uint4*>(x);
  float acc[kMats] = {};
  bool waited = false;
  for (int base = lane; base < in_chunks; base += 32 * kLoadsInFlight) {
    uint4 wv[kMats][kLoadsInFlight];
#pragma unroll
    for (int u = 0; u < kLoadsInFlight; ++u) {
      const int c = base + 32 * u;
#pragma unroll
      for (int m = 0; m < kMats; ++m) {
        wv[m][u] = c < in_chunks ? LoadWeights(w_row[m] + c) : make_uint4(0, 0, 0, 0);
      }
    }
    if (!waited) {  // x is the previous kernel's output
      WaitForPrerequisiteGrid();
      AllowDependentLaunch();
      waited = true;
    }
#pragma unroll
    for (int u = 0; u < kLoadsInFlight; ++u) {
      const int c = base + 32 * u;
      if (c >= in_chunks) break;
      const uint4 xv = __ldg(x_chunks + c);
#pragma unroll
      for (int m = 0; m < kMats; ++m) acc[m] = Dot8(wv[m][u], xv, acc[m]);
    }
  }
  if (!waited) {  // lanes past a short row
    WaitForPrerequisiteGrid();
    AllowDependentLaunch();
  }
#pragma unroll
  for (int m = 0; m < kMats; ++m) acc[m] = WarpSum(acc[m]);
  if (lane != 0) return;
  if constexpr (kSwiGlu) {
    Store(y + n, acc[0] / (1.f + __expf(-acc[0])) * acc[kMats - 1]);
  } else {
    Store(y + n, accumulate ? acc[0] + ToFloat(y[n]) : acc[0]);
  }
}

// Multiprocessors of the current device (cached per device).
absl::StatusOr<int> SmCount() {
  constexpr int kMaxDevices = 64;
  static int counts[kMaxDevices] = {};
  int device = 0;
  RETURN_IF_CUDA_ERROR(cudaGetDevice(&device));
  if (device < 0 || device >= kMaxDevices) return 132;
  if (counts[device] == 0) {
    RETURN_IF_CUDA_ERROR(
        cudaDeviceGetAttribute(&counts[device], cudaDevAttrMultiProcessorCount, device));
  }
  return counts[device];
}

template <bool kSwiGlu, typename OutT>
absl::Status Launch(const bf16* x, const bf16* w, int64_t in, int64_t out, OutT* y,
                    bool accumulate, cudaStream_t stream) {
  const int64_t ctas = (out + kWarpsPerCta - 1) / kWarpsPerCta;
  ASSIGN_OR_RETURN(const int sms, SmCount());
  const bool wide = ctas > int64_t{sms} * kDeepCtasPerSm && ctas <= int64_t{sms} * kWideCtasPerSm;
  const dim3 grid(static_cast<unsigned>(ctas));
  const int in_chunks = static_cast<int>(in / 8), features = static_cast<int>(out);
  if constexpr (kSwiGlu) {  // kWideLoads per row, two rows: the deep pipeline's depth
    RETURN_IF_CUDA_ERROR(LaunchOverlapped(SkinnyLinearKernel<kWideLoads, kSwiGlu, OutT>, grid,
                                          dim3(kThreads), 0, stream, x, w, in_chunks, features,
                                          y, accumulate));
  } else if (wide) {
    RETURN_IF_CUDA_ERROR(LaunchOverlapped(SkinnyLinearKernel<kWideLoads, kSwiGlu, OutT>, grid,
                                          dim3(kThreads), 0, stream, x, w, in_chunks, features,
                                          y, accumulate));
  } else {
    RETURN_IF_CUDA_ERROR(LaunchOverlapped(SkinnyLinearKernel<kDeepLoads, kSwiGlu, OutT>, grid,
                                          dim3(kThreads), 0, stream, x, w, in_chunks, features,
                                          y, accumulate));
  }
  RETURN_IF_CUDA_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

bool SkinnyLinearSupports(int64_t rows, int64_t in, int64_t out, const void* x, const void* w) {
  constexpr int64_t kMaxInt = std::numeric_limits<int>::max();
  return rows == 1 && in > 0 && in % 8 == 0 && in / 8 <= kMaxInt - 32 * kDeepLoads &&
         out > 0 && out <= kMaxInt - kWarpsPerCta && Aligned16(x) && Aligned16(w);
}

absl::Status SkinnyLinearCuda(const bf16* x, const bf16* w, int64_t rows, int64_t in,
                              int64_t out, void* y, GemmOutputType y_type, bool accumulate,
                              cudaStream_t stream) {
  if (!SkinnyLinearSupports(rows, in, out, x, w) || y == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("skinny linear: rows ", rows, ", in ", in,
                                                   ", out ", out, " (or a misaligned pointer)"));
  }
  if (y_type == GemmOutputType::kFp32) {
    return Launch<false>(x, w, in, out, static_cast<float*>(y), accumulate, stream);
  }
  return Launch<false>(x, w, in, out, static_cast<bf16*>(y), accumulate, stream);
}

absl::Status SkinnyLinearSwiGluCuda(const bf16* x, const bf16* w_gate_up, int64_t rows,
                                    int64_t in, int64_t inter, bf16* act, cudaStream_t stream) {
  if (!SkinnyLinearSupports(rows, in, 2 * inter, x, w_gate_up) || act == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("skinny linear swiglu: rows ", rows, ", in ",
                                                   in, ", inter ", inter,
                                                   " (or a misaligned pointer)"));
  }
  return Launch<true>(x, w_gate_up, in, inter, act, false, stream);
}

}  // namespace lazyattn
