// What the kernels need to know about the GPU, read at run time (never hard-coded): SM count,
// shared memory per block, L2 size, compute capability.
#ifndef LAZYATTN_KERNELS_CUDA_DEVICE_INFO_H_
#define LAZYATTN_KERNELS_CUDA_DEVICE_INFO_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace lazyattn {

struct DeviceInfo {
  int device = 0;
  std::string name;
  int compute_major = 0, compute_minor = 0;
  int sm_count = 0;
  int64_t global_memory_bytes = 0;
  int64_t l2_bytes = 0;
  int64_t max_shared_memory_per_block_optin = 0;
};

// Number of visible CUDA devices; 0 (not an error) on a machine without a GPU or driver.
int CudaDeviceCount();

// Unavailable when there is no such device.
absl::StatusOr<DeviceInfo> QueryDevice(int device);

// Runs a trivial kernel on `device` and checks its result: proves the build's machine code
// (sm_90) runs on this GPU.
absl::Status RunSmokeKernel(int device);

}  // namespace lazyattn

#endif  // LAZYATTN_KERNELS_CUDA_DEVICE_INFO_H_
