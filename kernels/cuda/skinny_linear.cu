#include "kernels/cuda/skinny_linear.h"

#include <limits>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch_overlap.cuh"
#include "kernels/cuda/rms_norm_row.cuh"

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
// What a warp does with its dot product(s):
// - kStore: y[n] = dot (+ y[n]);
// - kSwiGlu: two rows, n (gate) and out + n (up): y[n] = silu(gate) * up.
enum class Epilogue { kStore, kSwiGlu };

// The gate/up form loads two rows at kWideLoads each: as many registers as kDeepLoads.
constexpr int CtasPerSm(int loads, Epilogue e) {
  return loads * (e == Epilogue::kSwiGlu ? 2 : 1) == kDeepLoads ? kDeepCtasPerSm
                                                                 : kWideCtasPerSm;
}

// Weights are read once per step: keep them out of L1, where x is reused by every warp.
__device__ __forceinline__ uint4 LoadWeights(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// A plain load kept ahead of the weight loads that follow it (volatile asm keeps its order
// among the volatile weight loads; the compiler could otherwise sink it to its use).
__device__ __forceinline__ float LoadBeforeTheLoop(const float* p) {
  float v;
  asm volatile("ld.global.f32 %0, [%1];" : "=f"(v) : "l"(p));
  return v;
}
__device__ __forceinline__ float LoadBeforeTheLoop(const bf16* p) {
  unsigned short bits;
  asm volatile("ld.global.u16 %0, [%1];" : "=h"(bits) : "l"(p));
  return __bfloat162float(__ushort_as_bfloat16(bits));
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

__device__ __forceinline__ void Store(float* p, float v) { *p = v; }
__device__ __forceinline__ void Store(bf16* p, float v) { *p = __float2bfloat16_rn(v); }

// Where a kernel's input row comes from: a bf16 row in global memory, or (kNormed) an fp32 row
// that each CTA normalizes into shared memory first, bf16(x / rms(x) * norm_weight), with the
// arithmetic of RmsNormF32ToBf16Cuda (rms_norm_row.cuh), so the values equal that kernel's
// output bit for bit.
struct InputRow {
  const bf16* x;             // !kNormed
  const float* x_f32;        // kNormed: [in] fp32
  const bf16* norm_weight;   // kNormed: [in]
  float eps;
};

// The CTA writes the normalized row into `row` (in_chunks 16-byte pieces). Every thread of the
// CTA must call it (it has barriers).
__device__ __forceinline__ void NormalizeRowIntoShared(const InputRow& in, int in_chunks,
                                                       uint4* row) {
  const int n4 = in_chunks * 2, dim = in_chunks * 8;
  const float4* x4 = reinterpret_cast<const float4*>(in.x_f32);
  float sum_sq = 0.f;
  for (int i = threadIdx.x; i < n4; i += kRmsNormThreads) sum_sq += SumSquares4(x4[i]);
  const float inv = RmsNormInverse(RmsNormBlockSum(sum_sq), dim, in.eps);
  const uint2* w2 = reinterpret_cast<const uint2*>(in.norm_weight);
  uint2* out2 = reinterpret_cast<uint2*>(row);
  for (int i = threadIdx.x; i < n4; i += kRmsNormThreads) {
    out2[i] = RmsNormScale4(x4[i], inv, w2[i]);
  }
  __syncthreads();
}

// Warp n computes output feature n (with kSwiGlu, n and out + n) from the row `input` (kNormed:
// normalized by the CTA into dynamic shared memory first, in_chunks * 16 bytes) and
// `in_chunks` 16-byte pieces of weights per row; kEpi says what is stored.
template <int kLoadsInFlight, Epilogue kEpi, bool kNormed, typename OutT>
__global__ void __launch_bounds__(kThreads, CtasPerSm(kLoadsInFlight, kEpi))
    SkinnyLinearKernel(InputRow input, const bf16* __restrict__ w, int in_chunks, int out,
                       OutT* __restrict__ y, bool accumulate) {
  static_assert(!kNormed || kThreads == kRmsNormThreads, "the norm's reduction order");
  extern __shared__ uint4 normed_row[];
  constexpr int kMats = kEpi == Epilogue::kSwiGlu ? 2 : 1;
  constexpr int kStride = 32 * kLoadsInFlight;  // chunks a warp covers per pass
  const int lane = threadIdx.x % 32;
  const int n = blockIdx.x * kWarpsPerCta + threadIdx.x / 32;
  const bool active = n < out;
  const uint4* w_row[kMats];
  w_row[0] = reinterpret_cast<const uint4*>(w) + int64_t{active ? n : 0} * in_chunks;
  if constexpr (kMats == 2) w_row[1] = w_row[0] + int64_t{out} * in_chunks;
  // Software-pipelined in two halves: while one half's loads are consumed, the other half's
  // are in flight, so a warp never waits with no load outstanding (the long rows of the down
  // projection take 7 passes). The chunks are consumed in the same order as without it.
  constexpr int kHalf = kLoadsInFlight / 2;
  uint4 wv[kMats][kLoadsInFlight];
  auto issue = [&](int half, int base) {
#pragma unroll
    for (int u = half * kHalf; u < (half + 1) * kHalf; ++u) {
      const int c = base + 32 * u;
#pragma unroll
      for (int m = 0; m < kMats; ++m) {
        wv[m][u] = c < in_chunks ? LoadWeights(w_row[m] + c) : make_uint4(0, 0, 0, 0);
      }
    }
  };
  // The first weights are not the previous kernel's output: load them before waiting for it.
  if (active) {
    issue(0, lane);
    issue(1, lane);
  }
  WaitForPrerequisiteGrid();
  AllowDependentLaunch();
  const uint4* x_chunks;
  if constexpr (kNormed) {
    NormalizeRowIntoShared(input, in_chunks, normed_row);
    x_chunks = normed_row;
  } else {
    x_chunks = reinterpret_cast<const uint4*>(input.x);
  }
  if (!active) return;
  // The value to accumulate onto, read now: after the loop its latency would end the kernel.
  float y_old = 0.f;
  if (kEpi == Epilogue::kStore && accumulate && lane == 0) y_old = LoadBeforeTheLoop(y + n);
  float acc[kMats] = {};
  auto consume = [&](int half, int base) {
#pragma unroll
    for (int u = half * kHalf; u < (half + 1) * kHalf; ++u) {
      const int c = base + 32 * u;
      if (c >= in_chunks) break;
      const uint4 xv = kNormed ? x_chunks[c] : __ldg(x_chunks + c);
#pragma unroll
      for (int m = 0; m < kMats; ++m) acc[m] = Dot8(wv[m][u], xv, acc[m]);
    }
  };
  for (int base = lane; base < in_chunks; base += kStride) {
    const bool more = base + kStride < in_chunks;
    consume(0, base);
    if (more) issue(0, base + kStride);
    consume(1, base);
    if (more) issue(1, base + kStride);
  }
#pragma unroll
  for (int m = 0; m < kMats; ++m) acc[m] = WarpSum(acc[m]);
  if (lane != 0) return;
  if constexpr (kEpi == Epilogue::kSwiGlu) {
    Store(y + n, acc[0] / (1.f + __expf(-acc[0])) * acc[1]);
  } else {
    Store(y + n, accumulate ? acc[0] + y_old : acc[0]);
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

template <Epilogue kEpi, bool kNormed, typename OutT>
absl::Status Launch(const InputRow& x, const bf16* w, int64_t in, int64_t out, OutT* y,
                    bool accumulate, cudaStream_t stream) {
  const int64_t ctas = (out + kWarpsPerCta - 1) / kWarpsPerCta;
  ASSIGN_OR_RETURN(const int sms, SmCount());
  const bool wide = ctas > int64_t{sms} * kDeepCtasPerSm && ctas <= int64_t{sms} * kWideCtasPerSm;
  const dim3 grid(static_cast<unsigned>(ctas));
  const int in_chunks = static_cast<int>(in / 8), features = static_cast<int>(out);
  const size_t smem = kNormed ? static_cast<size_t>(in) * sizeof(bf16) : 0;
  auto launch = [&](auto kernel) {
    return LaunchOverlapped(kernel, grid, dim3(kThreads), smem, stream, x, w, in_chunks, features,
                            y, accumulate);
  };
  if constexpr (kEpi == Epilogue::kSwiGlu) {  // kWideLoads per row, two rows: the deep depth
    RETURN_IF_CUDA_ERROR(launch(SkinnyLinearKernel<kWideLoads, kEpi, kNormed, OutT>));
  } else if (wide) {
    RETURN_IF_CUDA_ERROR(launch(SkinnyLinearKernel<kWideLoads, kEpi, kNormed, OutT>));
  } else {
    RETURN_IF_CUDA_ERROR(launch(SkinnyLinearKernel<kDeepLoads, kEpi, kNormed, OutT>));
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
    return Launch<Epilogue::kStore, false>(InputRow{.x = x}, w, in, out, static_cast<float*>(y),
                                accumulate, stream);
  }
  return Launch<Epilogue::kStore, false>(InputRow{.x = x}, w, in, out, static_cast<bf16*>(y), accumulate,
                              stream);
}

absl::Status SkinnyLinearSwiGluCuda(const bf16* x, const bf16* w_gate_up, int64_t rows,
                                    int64_t in, int64_t inter, bf16* act, cudaStream_t stream) {
  if (!SkinnyLinearSupports(rows, in, 2 * inter, x, w_gate_up) || act == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("skinny linear swiglu: rows ", rows, ", in ",
                                                   in, ", inter ", inter,
                                                   " (or a misaligned pointer)"));
  }
  return Launch<Epilogue::kSwiGlu, false>(InputRow{.x = x}, w_gate_up, in, inter, act, false, stream);
}

bool SkinnyRmsNormLinearSupports(int64_t in, int64_t out, const float* x, const void* w) {
  return in <= kMaxNormedIn && SkinnyLinearSupports(1, in, out, x, w);
}

absl::Status SkinnyRmsNormLinearCuda(const float* x, const bf16* norm_weight, float eps,
                                     const bf16* w, int64_t in, int64_t out, void* y,
                                     GemmOutputType y_type, bool accumulate,
                                     cudaStream_t stream) {
  if (!SkinnyRmsNormLinearSupports(in, out, x, w) || !Aligned16(norm_weight) || y == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("skinny rms-norm linear: in ", in, ", out ",
                                                   out, " (or a misaligned pointer)"));
  }
  const InputRow row{.x_f32 = x, .norm_weight = norm_weight, .eps = eps};
  if (y_type == GemmOutputType::kFp32) {
    return Launch<Epilogue::kStore, true>(row, w, in, out, static_cast<float*>(y), accumulate, stream);
  }
  return Launch<Epilogue::kStore, true>(row, w, in, out, static_cast<bf16*>(y), accumulate, stream);
}

absl::Status SkinnyRmsNormLinearSwiGluCuda(const float* x, const bf16* norm_weight, float eps,
                                           const bf16* w_gate_up, int64_t in, int64_t inter,
                                           bf16* act, cudaStream_t stream) {
  if (!SkinnyRmsNormLinearSupports(in, 2 * inter, x, w_gate_up) || !Aligned16(norm_weight) ||
      act == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("skinny rms-norm linear swiglu: in ", in,
                                                   ", inter ", inter,
                                                   " (or a misaligned pointer)"));
  }
  const InputRow row{.x_f32 = x, .norm_weight = norm_weight, .eps = eps};
  return Launch<Epilogue::kSwiGlu, true>(row, w_gate_up, in, inter, act, false, stream);
}

}  // namespace lazyattn
