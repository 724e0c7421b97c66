// Token sampling: greedy, temperature, top-k, top-p, seeded.
//
// Order of operations (as vLLM and HF apply them): temperature scales the logits, top-k keeps the k
// most likely, top-p keeps the smallest set whose probability reaches p, then one draw. With
// temperature 0 the sampler is greedy (argmax; the lowest id wins ties) and ignores the rest.
#ifndef LAZYATTN_SERVICES_WORKER_ENGINE_SAMPLER_H_
#define LAZYATTN_SERVICES_WORKER_ENGINE_SAMPLER_H_

#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace lazyattn {

struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy
  int top_k = 0;             // 0: off
  float top_p = 1.0f;        // 1: off
  uint64_t seed = 0;
  int max_tokens = 128;
  std::vector<std::string> stop;          // generation ends before any of these strings
  std::vector<int32_t> stop_token_ids;    // ... or after any of these tokens (besides EOS)
  bool ignore_eos = false;
};

// InvalidArgument naming the field: temperature in [0, 100], top_k >= 0, top_p in (0, 1],
// max_tokens >= 1, stop strings non-empty (at most 16), stop ids inside the vocabulary.
absl::Status ValidateSamplingParams(const SamplingParams& params, int64_t vocab_size);

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);
  // Precondition: logits.size() == vocabulary size >= 1.
  int32_t Sample(std::span<const float> logits);

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> candidates_;
};

int32_t ArgMax(std::span<const float> logits);

}  // namespace lazyattn

#endif  // LAZYATTN_SERVICES_WORKER_ENGINE_SAMPLER_H_
