#include "kernels/cuda/device_info.h"

#include <cuda_runtime.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_check.h"

namespace lazyattn {
namespace {

__global__ void IotaSquaredKernel(int* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = i * i;
}

}  // namespace

int CudaDeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return count;
}

absl::StatusOr<DeviceInfo> QueryDevice(int device) {
  if (device < 0 || device >= CudaDeviceCount()) {
    return absl::UnavailableError(absl::StrCat("no CUDA device ", device));
  }
  cudaDeviceProp p;
  RETURN_IF_CUDA_ERROR(cudaGetDeviceProperties(&p, device));
  DeviceInfo info;
  info.device = device;
  info.name = p.name;
  info.compute_major = p.major;
  info.compute_minor = p.minor;
  info.sm_count = p.multiProcessorCount;
  info.global_memory_bytes = static_cast<int64_t>(p.totalGlobalMem);
  info.l2_bytes = p.l2CacheSize;
  info.max_shared_memory_per_block_optin = static_cast<int64_t>(p.sharedMemPerBlockOptin);
  return info;
}

absl::Status RunSmokeKernel(int device) {
  RETURN_IF_CUDA_ERROR(cudaSetDevice(device));
  constexpr int kN = 1000;
  int* d = nullptr;
  RETURN_IF_CUDA_ERROR(cudaMalloc(&d, kN * sizeof(int)));
  IotaSquaredKernel<<<(kN + 255) / 256, 256>>>(d, kN);
  absl::Status launch = CudaStatus(cudaGetLastError(), "IotaSquaredKernel", __FILE__, __LINE__);
  std::vector<int> h(kN);
  absl::Status copy = CudaStatus(cudaMemcpy(h.data(), d, kN * sizeof(int), cudaMemcpyDeviceToHost),
                                 "cudaMemcpy", __FILE__, __LINE__);
  cudaFree(d);
  if (!launch.ok()) return launch;
  if (!copy.ok()) return copy;
  for (int i = 0; i < kN; ++i) {
    if (h[i] != i * i) {
      return absl::InternalError(absl::StrCat("smoke kernel: element ", i, " is ", h[i]));
    }
  }
  return absl::OkStatus();
}

}  // namespace lazyattn
