// Picks and builds a worker's backend: `cpu`, `cuda`, or `auto` (the CUDA backend when it is
// built in and a GPU is visible, the CPU backend otherwise).
#ifndef LAZYATTN_SERVICES_WORKER_ENGINE_RUNNER_FACTORY_H_
#define LAZYATTN_SERVICES_WORKER_ENGINE_RUNNER_FACTORY_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "services/worker/engine/model_runner.h"
#include "services/worker/model/model_weights.h"

namespace lazyattn {

enum class Backend { kCpu, kCuda, kAuto };

// "cpu", "cuda" or "auto"; InvalidArgument naming the accepted values otherwise.
absl::StatusOr<Backend> ParseBackend(std::string_view name);
std::string BackendName(Backend backend);

// Whether this binary contains the CUDA backend (it was compiled with nvcc).
bool CudaBackendBuiltIn();
// kAuto resolved: kCuda when the backend is built in and a GPU is visible, kCpu otherwise.
// kCpu and kCuda are returned as they are.
Backend ResolveBackend(Backend backend);

struct RunnerOptions {
  Backend backend = Backend::kAuto;
  // Bytes of KV storage: fp32 in host memory (cpu) or bf16 in GPU memory (cuda).
  int64_t kv_budget_bytes = int64_t{512} << 20;
  int device = 0;  // CUDA device
};

// The backend over `weights` (the CPU backend borrows them: they must outlive the runner; the
// CUDA backend copies them to the GPU as bf16). FailedPrecondition for `cuda` in a build without
// it; Unavailable for `cuda` without a usable GPU; ResourceExhausted when the weights or the KV
// pool do not fit.
absl::StatusOr<std::unique_ptr<ModelRunner>> CreateModelRunner(const ModelWeights* weights,
                                                               const RunnerOptions& options);

// A model path `random:SHAPE` or `random:SHAPE:SEED` (shapes: NamedModelShape): weights drawn
// from the seed (default 1), generated on the GPU by the CUDA backend (so llama3-8b needs no
// 32 GB of host memory) and on the host by the CPU backend, served with the byte tokenizer
// (byte_tokenizer.h). For benchmarks and cluster runs that need no download.
struct RandomModelSpec {
  ModelConfig config;
  uint64_t seed = 1;
};
bool IsRandomModelPath(std::string_view path);
// InvalidArgument naming the shape or the seed when they do not parse.
absl::StatusOr<RandomModelSpec> ParseRandomModelPath(std::string_view path);
// Different for every shape, seed and backend (the two backends draw different numbers).
std::string RandomModelFingerprint(const RandomModelSpec& spec, Backend resolved_backend);
absl::StatusOr<std::unique_ptr<ModelRunner>> CreateRandomModelRunner(const RandomModelSpec& spec,
                                                                     const RunnerOptions& options);

}  // namespace lazyattn

#endif  // LAZYATTN_SERVICES_WORKER_ENGINE_RUNNER_FACTORY_H_
