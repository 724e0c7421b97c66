// Random weights of a given shape, for tests and for benchmarks that need no download.
#ifndef LAZYATTN_SERVICES_WORKER_MODEL_RANDOM_WEIGHTS_H_
#define LAZYATTN_SERVICES_WORKER_MODEL_RANDOM_WEIGHTS_H_

#include <cstdint>
#include <memory>

#include "services/worker/model/model_weights.h"

namespace lazyattn {

// Normal(0, stddev) matrices and norm weights near 1, deterministic in `seed`. The config must pass
// ValidateModelConfig.
std::unique_ptr<ModelWeights> MakeRandomWeights(const ModelConfig& config, uint64_t seed,
                                                float stddev = 0.05f);

// A small llama-shaped config (2 layers, hidden 64, 4/2 heads of 16, vocab 300) for unit tests.
ModelConfig TinyTestConfig();

}  // namespace lazyattn

#endif  // LAZYATTN_SERVICES_WORKER_MODEL_RANDOM_WEIGHTS_H_
