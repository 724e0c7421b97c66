// Random weights of a given shape, for tests and for benchmarks that need no download.
#ifndef LAZYATTN_SERVICES_WORKER_MODEL_RANDOM_WEIGHTS_H_
#define LAZYATTN_SERVICES_WORKER_MODEL_RANDOM_WEIGHTS_H_

#include <cstdint>
#include <memory>
#include <string_view>

#include "absl/status/statusor.h"

#include "services/worker/model/model_weights.h"

namespace lazyattn {

// Normal(0, stddev) matrices and norm weights near 1, deterministic in `seed`. The config must pass
// ValidateModelConfig.
std::unique_ptr<ModelWeights> MakeRandomWeights(const ModelConfig& config, uint64_t seed,
                                                float stddev = 0.05f);

// Named shapes for random-weight benchmarks and tests:
//   llama3-8b     32 layers, hidden 4096, 32/8 heads of 128, MLP 14336, vocab 128256, rope theta
//                 500000 with Llama-3 scaling (factor 8), context 131072;
//   llama3-8b-2l  the same layers, only 2 of them (cheap checks of the full-size shapes);
//   small         4 layers, hidden 512, 8/2 heads of 64, MLP 1408, vocab 1024, context 4096.
// InvalidArgument listing the names for any other.
absl::StatusOr<ModelConfig> NamedModelShape(std::string_view name);

// A small llama-shaped config (2 layers, hidden 64, 4/2 heads of 16, vocab 300) for unit tests.
ModelConfig TinyTestConfig();

}  // namespace lazyattn

#endif  // LAZYATTN_SERVICES_WORKER_MODEL_RANDOM_WEIGHTS_H_
