#include "kernels/cuda/embedding.h"

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch_overlap.cuh"

namespace lazyattn {
namespace {

// One CTA per token; 16-byte copies when rows are 16-byte aligned.
__global__ void EmbeddingKernel(const __nv_bfloat16* table, int64_t vocab, int64_t dim,
                                const int32_t* ids, __nv_bfloat16* out) {
  // Launched overlapped: wait, then let the next kernel launch (launch_overlap.cuh).
  WaitForPrerequisiteGrid();
  AllowDependentLaunch();
  const int t = blockIdx.x;
  const int32_t id = ids[t];
  const bool ok = id >= 0 && id < vocab;
  __nv_bfloat16* dst = out + int64_t(t) * dim;
  if (dim % 8 == 0) {
    const uint4* src = reinterpret_cast<const uint4*>(table + (ok ? int64_t(id) * dim : 0));
    uint4* d4 = reinterpret_cast<uint4*>(dst);
    for (int64_t i = threadIdx.x; i < dim / 8; i += blockDim.x) {
      d4[i] = ok ? src[i] : make_uint4(0, 0, 0, 0);
    }
  } else {
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
      dst[i] = ok ? table[int64_t(id) * dim + i] : __float2bfloat16_rn(0.f);
    }
  }
}

// One CTA per row. Every load of a thread is issued before its stores (__restrict__, loads
// batched four at a time): a one-row gather is then about one memory round trip, not one per
// element.
template <typename From>
__global__ void GatherToF32Kernel(const From* __restrict__ table, int64_t vocab, int64_t dim,
                                  const int32_t* __restrict__ ids, float* __restrict__ out) {
  constexpr int kBatch = 4;
  const int t = blockIdx.x;
  const int32_t id = ids[t];
  const bool ok = id >= 0 && id < vocab;
  const From* src = table + (ok ? int64_t(id) * dim : 0);
  float* dst = out + int64_t(t) * dim;
  for (int64_t first = threadIdx.x; first < dim; first += int64_t(kBatch) * blockDim.x) {
    float v[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int64_t i = first + int64_t(b) * blockDim.x;
      v[b] = ok && i < dim ? static_cast<float>(src[i]) : 0.f;
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int64_t i = first + int64_t(b) * blockDim.x;
      if (i < dim) dst[i] = v[b];
    }
  }
}

absl::Status CheckGather(int n, int64_t vocab, int64_t dim) {
  if (n < 0 || vocab <= 0 || dim <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("gather: n ", n, ", rows ", vocab, ", dim ", dim));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status EmbeddingGatherToF32Cuda(const __nv_bfloat16* table, int64_t vocab, int64_t dim,
                                      const int32_t* ids, int n, float* out,
                                      cudaStream_t stream) {
  if (absl::Status s = CheckGather(n, vocab, dim); !s.ok()) return s;
  if (n == 0) return absl::OkStatus();
  GatherToF32Kernel<<<n, 1024, 0, stream>>>(table, vocab, dim, ids, out);
  RETURN_IF_CUDA_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

absl::Status EmbeddingGatherCuda(const __nv_bfloat16* table, int64_t vocab, int64_t dim,
                                 const int32_t* ids, int n, __nv_bfloat16* out,
                                 cudaStream_t stream) {
  if (n < 0 || vocab <= 0 || dim <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("embedding: n ", n, ", vocab ", vocab, ", dim ", dim));
  }
  if (n == 0) return absl::OkStatus();
  RETURN_IF_CUDA_ERROR(LaunchOverlapped(EmbeddingKernel, dim3(n), dim3(128), 0, stream, table,
                                        vocab, dim, ids, out));
  return absl::OkStatus();
}

}  // namespace lazyattn
