// SwiGLU of the Llama MLP on bf16 (CUDA): out[r][i] = silu(gate[r][i]) * up[r][i], fp32 math.
// CPU twin: SwiGluCpu (kernels/include/swiglu.h); same [rows][2*dim] gate|up layout.
#ifndef LAZYATTN_KERNELS_CUDA_SWIGLU_H_
#define LAZYATTN_KERNELS_CUDA_SWIGLU_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace lazyattn {

absl::Status SwiGluCuda(const __nv_bfloat16* gate_up, int64_t rows, int64_t dim,
                        __nv_bfloat16* out, cudaStream_t stream);

}  // namespace lazyattn

#endif  // LAZYATTN_KERNELS_CUDA_SWIGLU_H_
