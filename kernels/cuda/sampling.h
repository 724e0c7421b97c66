// Token sampling on the GPU: greedy, temperature, top-k, top-p, one draw per row.
//
// Same rules as the CPU Sampler (services/worker/engine/sampler.h): temperature 0 is greedy
// (argmax, the lowest id wins ties); otherwise logits are scaled by 1/temperature, top-k keeps
// the k largest (ties at the k-th value: lowest ids first), top-p keeps the smallest prefix of
// the remaining tokens, ordered by (scaled logit desc, id asc), whose probability reaches p, and
// one token is drawn from what is left in proportion to exp(scaled logit - max).
// Differences from the CPU twin, by design: the draw comes from (seed, offset) through a
// counter-based hash (the CPU uses mt19937_64), so the same seed samples the same distribution,
// not the same token; probabilities are summed in 32.32 fixed point (exact and deterministic:
// a token with probability under 2^-32 of the top token's is never drawn); NaN logits rank
// lowest.
#ifndef LAZYATTN_KERNELS_CUDA_SAMPLING_H_
#define LAZYATTN_KERNELS_CUDA_SAMPLING_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace lazyattn {

struct SamplingRowParams {
  float temperature = 0.0f;  // 0: greedy
  int32_t top_k = 0;         // 0 (or >= vocab): off
  float top_p = 1.0f;        // 1: off; in (0, 1]
  uint32_t reserved = 0;
  uint64_t seed = 0;
  uint64_t offset = 0;  // draw counter, e.g. the number of tokens generated so far
};

// logits: device [rows][row_stride] fp32 (the first `vocab` of each row are used);
// params: device [rows]; out_ids: device [rows].
absl::Status SampleTokensCuda(const float* logits, int64_t row_stride, int rows, int vocab,
                              const SamplingRowParams* params, int32_t* out_ids,
                              cudaStream_t stream);

// Greedy rows only, spread over the whole card: the same argmax as SampleTokensCuda's greedy rule
// (the lowest id among equal maxima, NaN lowest), found by many CTAs per row instead of one (one
// CTA reads a 128K vocabulary in ~24 us; the GPU's decode step has no time for that). Each CTA
// folds its slice into packed[row] with a 64-bit atomicMax of (order key << 32 | ~id), so the
// result does not depend on the order CTAs finish in. packed: device [rows], cleared by this
// call (a memset on the stream); the id is GreedyIdFromPacked(packed[row]).
absl::Status GreedyArgmaxCuda(const float* logits, int64_t row_stride, int rows, int vocab,
                              uint64_t* packed, cudaStream_t stream);

inline int32_t GreedyIdFromPacked(uint64_t packed) {
  return static_cast<int32_t>(~static_cast<uint32_t>(packed));
}

// tokens[i] = GreedyIdFromPacked(packed[source_rows[i]]) for i < rows, on the device: a step's
// greedy ids become the next step's input tokens without a trip through the host (pipelined
// decode). source_rows: device [rows], each a valid row of `packed`.
absl::Status GreedyIdsToTokensCuda(const uint64_t* packed, const int32_t* source_rows, int rows,
                                   int32_t* tokens, cudaStream_t stream);

}  // namespace lazyattn

#endif  // LAZYATTN_KERNELS_CUDA_SAMPLING_H_
