// SwiGLU activation of the Llama MLP: out[i] = silu(gate[i]) * up[i], silu(x) = x / (1 + e^-x).
#ifndef LAZYATTN_KERNELS_INCLUDE_SWIGLU_H_
#define LAZYATTN_KERNELS_INCLUDE_SWIGLU_H_

#include <cstdint>

namespace lazyattn {

// gate_up: [rows][2 * dim] with gate in the first half and up in the second (the projections are
// fused into one GEMM); out: [rows][dim].
void SwiGluCpu(const float* gate_up, int64_t rows, int64_t dim, float* out);

}  // namespace lazyattn

#endif  // LAZYATTN_KERNELS_INCLUDE_SWIGLU_H_
