// CUDA and cuBLAS errors as absl::Status: no kernel or host wrapper aborts the process.
//
//   RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(...));
// returns Internal("cudaMemcpyAsync(...) failed at file.cu:42: an illegal memory access ...")
// from the enclosing function when the call does not return cudaSuccess.
#ifndef LAZYATTN_KERNELS_CUDA_CUDA_CHECK_H_
#define LAZYATTN_KERNELS_CUDA_CUDA_CHECK_H_

#include <cuda_runtime_api.h>

#include "absl/status/status.h"

namespace lazyattn {

// OK for cudaSuccess; otherwise Internal (Unavailable for "no device" / "driver missing") with the
// call text, location and CUDA's error string. Errors that leave the context corrupt for the rest
// of the process (cudaErrorIllegalAddress, cudaErrorLaunchFailure, ...) are marked sticky
// (common/device_error.h): the worker's engine then stops serving at once.
absl::Status CudaStatus(cudaError_t error, const char* call, const char* file, int line);

}  // namespace lazyattn

#define RETURN_IF_CUDA_ERROR(call)                                                          \
  do {                                                                                      \
    ::absl::Status lazyattn_cuda_status_ =                                                  \
        ::lazyattn::CudaStatus((call), #call, __FILE__, __LINE__);                          \
    if (!lazyattn_cuda_status_.ok()) return lazyattn_cuda_status_;                          \
  } while (0)

#endif  // LAZYATTN_KERNELS_CUDA_CUDA_CHECK_H_
