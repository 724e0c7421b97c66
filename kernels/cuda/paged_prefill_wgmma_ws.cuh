// Internal to the paged prefill attention (not a public header): the launcher of the
// warp-specialized wgmma kernel (paged_prefill_wgmma_ws.cu, PrefillKernel::kWgmmaWs, sm_90a
// only) that paged_prefill_attention.cu calls, beside LaunchMmaSync (paged_prefill_internal.cuh).
#ifndef LAZYATTN_KERNELS_CUDA_PAGED_PREFILL_WGMMA_WS_CUH_
#define LAZYATTN_KERNELS_CUDA_PAGED_PREFILL_WGMMA_WS_CUH_

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "kernels/cuda/paged_prefill_attention.h"
#include "kernels/cuda/paged_prefill_internal.cuh"

namespace lazyattn::prefill_internal {

// Compiled variants of the kernel (PrefillWgmmaWsVariantName() names them; 0 is the default).
constexpr int kWgmmaWsVariants = 3;

// The attention pass of the warp-specialized kernel: head_dim 128, kRotateQ or kNone, variant
// 0..kWgmmaWsVariants-1 (InvalidArgument otherwise; Internal if the kernel was built with a
// register count its setmaxnreg budget does not hold for). The caller launches the merge of
// split-KV partials after it, as for the other kernels.
absl::Status LaunchWgmmaWsAttention(const PagedPrefillPlan& plan, const Params& params,
                                    PrefillRotation rotation, int variant, cudaStream_t stream);

}  // namespace lazyattn::prefill_internal

#endif  // LAZYATTN_KERNELS_CUDA_PAGED_PREFILL_WGMMA_WS_CUH_
