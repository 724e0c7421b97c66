// Device-side weight initialisation (CUDA): normal random fills reproducible from a seed, and
// fp32 -> bf16 conversion of uploaded tensors. Kept apart from cuda_model_weights so this file
// compiles as CUDA C++17 without the model headers.
#ifndef LAZYATTN_SERVICES_WORKER_CUDA_WEIGHT_FILL_H_
#define LAZYATTN_SERVICES_WORKER_CUDA_WEIGHT_FILL_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace lazyattn {

// out[i] = bf16(mean + stddev * N(0,1)), where the normal draw is a pure function of
// (seed, stream_id, i) (counter-based hash + Box-Muller): the same seed gives the same tensor on
// any GPU, whatever the launch shape.
absl::Status FillNormalBf16(__nv_bfloat16* out, int64_t n, uint64_t seed, uint64_t stream_id,
                            float mean, float stddev, cudaStream_t stream);

// out[i] = bf16(in[i]), round to nearest even (device pointers).
absl::Status ConvertF32ToBf16(const float* in, int64_t n, __nv_bfloat16* out,
                              cudaStream_t stream);

}  // namespace lazyattn

#endif  // LAZYATTN_SERVICES_WORKER_CUDA_WEIGHT_FILL_H_
