#include "kernels/cuda/cuda_check.h"

#include "absl/strings/str_cat.h"

namespace lazyattn {

absl::Status CudaStatus(cudaError_t error, const char* call, const char* file, int line) {
  if (error == cudaSuccess) return absl::OkStatus();
  const std::string message = absl::StrCat(call, " failed at ", file, ":", line, ": ",
                                           cudaGetErrorName(error), ": ", cudaGetErrorString(error));
  if (error == cudaErrorNoDevice || error == cudaErrorInsufficientDriver) {
    return absl::UnavailableError(message);
  }
  return absl::InternalError(message);
}

}  // namespace lazyattn
