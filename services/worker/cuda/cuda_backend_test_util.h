// Helpers shared by the CUDA backend's tests (cuda_backend_test.cc, cuda_long_context_test.cc):
// comparing logits rows against the CPU backend's, and small random models both backends hold
// identically.
#ifndef LAZYATTN_SERVICES_WORKER_CUDA_CUDA_BACKEND_TEST_UTIL_H_
#define LAZYATTN_SERVICES_WORKER_CUDA_CUDA_BACKEND_TEST_UTIL_H_

#include <cstdint>
#include <memory>
#include <span>

#include "services/worker/cuda/cuda_model_runner.h"
#include "services/worker/engine/model_runner.h"
#include "services/worker/model/model_weights.h"

namespace lazyattn {

struct LogitsDiff {
  double rel_err = 0, cosine = 0, max_abs = 0;
  bool same_argmax = false;
  // The reference's top logit minus its second, over the std of its logits (rel_err's unit).
  double ref_margin = 0;
};

// rel_err = max |ours - ref| / std(ref) over the row, and the rows' cosine.
LogitsDiff CompareLogits(std::span<const float> ours, std::span<const float> ref);

// A CUDA runner over an upload of `w` with `blocks` KV blocks; nullptr (and a test failure) if
// either step fails.
std::unique_ptr<ModelRunner> CudaRunnerFor(
    const ModelWeights& w, int64_t blocks,
    int wgmma_max_rows = CudaRunnerOptions{}.wgmma_max_rows);

// The "small" random shape (services/worker/model/random_weights.h).
ModelConfig SmallConfig();

// Random weights scaled like HF's initialisation (every matrix N(0, 0.02)), already rounded to
// bf16 so both backends hold identical weights and only activation rounding differs. (The larger
// scales of MakeRandomWeights' defaults give attention logits of ~20, where any rounding flips
// the softmax: no bf16 implementation could match fp32 there.)
std::unique_ptr<ModelWeights> HfLikeWeights(const ModelConfig& c, uint32_t seed);

}  // namespace lazyattn

#endif  // LAZYATTN_SERVICES_WORKER_CUDA_CUDA_BACKEND_TEST_UTIL_H_
