#include "kernels/cuda/cuda_check.h"

#include "absl/strings/str_cat.h"
#include "common/device_error.h"

namespace lazyattn {

absl::Status CudaStatus(cudaError_t error, const char* call, const char* file, int line) {
  if (error == cudaSuccess) return absl::OkStatus();
  const std::string message = absl::StrCat(call, " failed at ", file, ":", line, ": ",
                                           cudaGetErrorName(error), ": ", cudaGetErrorString(error));
  if (error == cudaErrorNoDevice || error == cudaErrorInsufficientDriver) {
    return absl::UnavailableError(message);
  }
  switch (error) {
    // Sticky: the context is corrupt and every later CUDA call of this process fails (CUDA
    // runtime API documentation); the worker must stop serving, not retry the next step.
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorLaunchTimeout:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorAssert:
    case cudaErrorECCUncorrectable:
      return MarkStickyDeviceError(absl::InternalError(message));
    default:
      // The runtime keeps this error as the thread's last one until read; left there, the next
      // step's first cudaGetLastError() after a launch would fail that step for it.
      cudaGetLastError();
      return absl::InternalError(message);
  }
}

}  // namespace lazyattn
