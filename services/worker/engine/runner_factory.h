// Picks and builds a worker's backend: `cpu`, `cuda`, or `auto` (the CUDA backend when it is
// built in and a GPU is visible, the CPU backend otherwise), and loads a model path onto it
// (LoadServedModel: what the worker, `lazyattn generate/replay` and lazyattn-logits call).
#ifndef LAZYATTN_SERVICES_WORKER_ENGINE_RUNNER_FACTORY_H_
#define LAZYATTN_SERVICES_WORKER_ENGINE_RUNNER_FACTORY_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "services/worker/engine/model_runner.h"
#include "services/worker/model/model_weights.h"
#include "services/worker/model/tokenizer/tokenizer.h"

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

// The host memory a runner of `config` takes before it serves: the RoPE table of the model's
// whole context (fp32 cos and sin, max_positions x head_dim values: 64 MiB for 128K positions of
// head_dim 128, 32 GiB for a file that claims 2^24 of head_dim 512) and, on the CPU backend, the
// KV pool of `kv_budget_bytes` (0 for cuda). Checked against `available_bytes`
// (AvailableHostMemoryBytes(); negative: unknown, not checked) before anything is allocated,
// since Linux overcommits and zeroing more than the machine has ends in its OOM killer.
// ResourceExhausted naming engine.kv_budget_bytes or the context length that does not fit.
absl::Status CheckRunnerHostMemory(const ModelConfig& config, int64_t kv_budget_bytes,
                                   int64_t available_bytes);

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

// How LoadServedModel loads a model path on a resolved backend (kCpu or kCuda).
enum class ModelLoadPath {
  kRandom,       // random:SHAPE[:SEED], generated where the backend runs
  kHostWeights,  // LoadModel's fp32 host weights: the CPU backend borrows them, the CUDA backend
                 // uploads them (safetensors on cuda, anything on cpu)
  kGgufToGpu,    // a GGUF file on cuda: dequantized on the GPU as stored, no fp32 host copy
                 // (LoadGgufModelToGpu in services/worker/cuda/cuda_model_loader.h)
};
// Errors: DetectModelFormat's for a path that is not random:... (NotFound naming a missing path,
// InvalidArgument for an unknown format or a path that cannot be looked at); the random spec itself is parsed by LoadServedModel.
absl::StatusOr<ModelLoadPath> ChooseModelLoadPath(const std::string& path,
                                                  Backend resolved_backend);

// A model on its backend, ready to serve. `runner` is declared last so that it is destroyed
// before the host weights it may borrow; an Engine built over it must not outlive the tokenizer
// or the host weights.
struct ServedModel {
  ModelConfig config;
  std::unique_ptr<Tokenizer> tokenizer;  // null when ServedModelOptions::load_tokenizer is false
  std::string fingerprint;               // ModelFingerprint, or RandomModelFingerprint
  std::unique_ptr<ModelWeights> host_weights;  // what the CPU runner borrows; null on cuda
  std::unique_ptr<ModelRunner> runner;
};

struct ServedModelOptions {
  RunnerOptions runner;
  // False skips the tokenizer (for callers that feed token ids: an HF directory then needs no
  // tokenizer.json).
  bool load_tokenizer = true;
};

// Which step LoadServedModel failed in, for callers that report a failure against the setting
// behind it (the worker's model.path and backend keys): kModel while reading the model (which,
// for kGgufToGpu, includes its upload), kBackend while choosing the device or building the
// runner.
enum class ModelLoadStage { kModel, kBackend };

// Loads `path` (a .gguf file, an HF directory, or random:SHAPE[:SEED]) onto the backend of
// options.runner by the ChooseModelLoadPath rule. Errors are those of the loader (naming the
// file) or of the runner factory (FailedPrecondition for cuda in a build without it,
// Unavailable without a usable GPU, ResourceExhausted when the weights or the KV pool do not
// fit); never an abort. `failed_stage`, when not null, says where a failure came from.
absl::StatusOr<ServedModel> LoadServedModel(const std::string& path,
                                            const ServedModelOptions& options,
                                            ModelLoadStage* failed_stage = nullptr);

}  // namespace lazyattn

#endif  // LAZYATTN_SERVICES_WORKER_ENGINE_RUNNER_FACTORY_H_
