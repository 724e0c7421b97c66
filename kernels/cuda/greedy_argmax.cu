// The all-greedy path of kernels/cuda/sampling.h: a many-CTA argmax per row (steps whose rows
// are all greedy, without penalties or log-probabilities, skip the sampling kernel's clusters).
#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/sampling.h"

namespace lazyattn {
namespace {

__device__ __forceinline__ uint32_t OrderKey(float x) {
  return SamplingOrderKey(x, __float_as_uint(x));
}

// Grid (slices, rows); each thread folds float4s of its slice, then warp and CTA maxima, then
// one atomicMax per CTA.
constexpr int kArgmaxThreads = 256;
constexpr int kArgmaxPerCta = 4096;  // logits a CTA reads: 4 float4 per thread

__global__ void __launch_bounds__(kArgmaxThreads)
    GreedyArgmaxKernel(const float* __restrict__ logits, int64_t row_stride, int vocab,
                       unsigned long long* __restrict__ packed) {
  const float* x = logits + int64_t(blockIdx.y) * row_stride;
  const int first = blockIdx.x * kArgmaxPerCta;
  const int end = min(vocab, first + kArgmaxPerCta);
  uint64_t best = 0;
  auto fold = [&](float v, int i) {
    const uint64_t key = (uint64_t(OrderKey(v)) << 32) | uint32_t(~uint32_t(i));
    best = key > best ? key : best;
  };
  const bool vec = row_stride % 4 == 0 && reinterpret_cast<uintptr_t>(logits) % 16 == 0;
  if (vec) {
#pragma unroll
    for (int u = 0; u < kArgmaxPerCta / (4 * kArgmaxThreads); ++u) {
      const int i = first + 4 * (threadIdx.x + u * kArgmaxThreads);
      if (i + 3 < end) {
        const float4 v = *reinterpret_cast<const float4*>(x + i);
        fold(v.x, i), fold(v.y, i + 1), fold(v.z, i + 2), fold(v.w, i + 3);
      } else {
        for (int j = i; j < end; ++j) fold(x[j], j);
      }
    }
  } else {
    for (int i = first + threadIdx.x; i < end; i += kArgmaxThreads) fold(x[i], i);
  }
  for (int o = 16; o > 0; o >>= 1) {
    const uint64_t v = __shfl_xor_sync(0xffffffffu, best, o);
    best = v > best ? v : best;
  }
  __shared__ uint64_t warp_best[kArgmaxThreads / 32];
  if (threadIdx.x % 32 == 0) warp_best[threadIdx.x / 32] = best;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kArgmaxThreads / 32; ++w) best = warp_best[w] > best ? warp_best[w] : best;
    atomicMax(packed + blockIdx.y, static_cast<unsigned long long>(best));
  }
}

}  // namespace

absl::Status GreedyArgmaxCuda(const float* logits, int64_t row_stride, int rows, int vocab,
                              uint64_t* packed, cudaStream_t stream) {
  if (rows < 0 || vocab <= 0 || row_stride < vocab) {
    return absl::InvalidArgumentError(absl::StrCat("greedy argmax: rows ", rows, ", vocab ",
                                                   vocab, ", row_stride ", row_stride));
  }
  if (rows == 0) return absl::OkStatus();
  if (logits == nullptr || packed == nullptr) {
    return absl::InvalidArgumentError("greedy argmax: a required pointer is null");
  }
  RETURN_IF_CUDA_ERROR(cudaMemsetAsync(packed, 0, size_t(rows) * sizeof(uint64_t), stream));
  constexpr int kMaxGridRows = 65535;  // gridDim.y
  for (int first = 0; first < rows; first += kMaxGridRows) {
    const dim3 grid((vocab + kArgmaxPerCta - 1) / kArgmaxPerCta,
                    std::min(kMaxGridRows, rows - first));
    GreedyArgmaxKernel<<<grid, kArgmaxThreads, 0, stream>>>(
        logits + int64_t(first) * row_stride, row_stride, vocab,
        reinterpret_cast<unsigned long long*>(packed + first));
  }
  RETURN_IF_CUDA_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

namespace {
__global__ void GreedyIdsToTokensKernel(const uint64_t* __restrict__ packed,
                                        const int32_t* __restrict__ source_rows, int rows,
                                        int32_t* __restrict__ tokens) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < rows) tokens[i] = static_cast<int32_t>(~static_cast<uint32_t>(packed[source_rows[i]]));
}
}  // namespace

absl::Status GreedyIdsToTokensCuda(const uint64_t* packed, const int32_t* source_rows, int rows,
                                   int32_t* tokens, cudaStream_t stream) {
  if (rows < 0) return absl::InvalidArgumentError(absl::StrCat("greedy ids: rows ", rows));
  if (rows == 0) return absl::OkStatus();
  if (packed == nullptr || source_rows == nullptr || tokens == nullptr) {
    return absl::InvalidArgumentError("greedy ids: a required pointer is null");
  }
  constexpr int kThreadsPerCta = 256;
  GreedyIdsToTokensKernel<<<(rows + kThreadsPerCta - 1) / kThreadsPerCta, kThreadsPerCta, 0,
                            stream>>>(packed, source_rows, rows, tokens);
  RETURN_IF_CUDA_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace lazyattn
