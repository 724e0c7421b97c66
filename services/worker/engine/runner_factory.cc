#include "services/worker/engine/runner_factory.h"

#include <new>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/document_key.h"
#include "common/status_macros.h"
#include "services/worker/engine/cpu_runner.h"
#include "services/worker/engine/host_memory.h"
#include "services/worker/engine/kv_cache_cpu.h"
#include "services/worker/model/model_fingerprint.h"
#include "services/worker/model/model_loader.h"
#include "services/worker/model/random_weights.h"
#include "services/worker/model/tokenizer/byte_tokenizer.h"

#ifdef LAZYATTN_WITH_CUDA_BACKEND
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_info.h"
#include "services/worker/cuda/cuda_model_loader.h"
#include "services/worker/cuda/cuda_model_runner.h"
#endif

namespace lazyattn {

absl::StatusOr<Backend> ParseBackend(std::string_view name) {
  if (name == "cpu") return Backend::kCpu;
  if (name == "cuda") return Backend::kCuda;
  if (name == "auto") return Backend::kAuto;
  return absl::InvalidArgumentError(
      absl::StrCat("backend \"", std::string(name), "\" is not one of cpu, cuda, auto"));
}

std::string BackendName(Backend backend) {
  switch (backend) {
    case Backend::kCpu:
      return "cpu";
    case Backend::kCuda:
      return "cuda";
    case Backend::kAuto:
      return "auto";
  }
  return "?";
}

bool CudaBackendBuiltIn() {
#ifdef LAZYATTN_WITH_CUDA_BACKEND
  return true;
#else
  return false;
#endif
}

Backend ResolveBackend(Backend backend) {
  if (backend != Backend::kAuto) return backend;
#ifdef LAZYATTN_WITH_CUDA_BACKEND
  if (CudaDeviceCount() > 0) return Backend::kCuda;
#endif
  return Backend::kCpu;
}

namespace {

// Every runner checks what it will take from the host before it allocates (the CUDA runner
// builds the RoPE table on the host before it uploads it).
absl::Status CheckHostMemory(const ModelConfig& config, int64_t kv_budget_bytes) {
  return CheckRunnerHostMemory(config, kv_budget_bytes, AvailableHostMemoryBytes());
}

#ifdef LAZYATTN_WITH_CUDA_BACKEND
// The CUDA backend on options.device with the weights `make_weights` puts there (called with that
// device current). Unavailable without such a device.
template <typename MakeWeights>
absl::StatusOr<std::unique_ptr<ModelRunner>> CudaRunnerWith(const RunnerOptions& options,
                                                            MakeWeights make_weights) {
  if (CudaDeviceCount() <= options.device) {
    return absl::UnavailableError(
        absl::StrCat("backend cuda: no CUDA device ", options.device, " is visible"));
  }
  RETURN_IF_CUDA_ERROR(cudaSetDevice(options.device));
  ASSIGN_OR_RETURN(auto gpu_weights, make_weights());
  // The runner builds the RoPE table on the host before it uploads it.
  RETURN_IF_ERROR(CheckHostMemory(gpu_weights->config(), /*kv_budget_bytes=*/0));
  ASSIGN_OR_RETURN(auto runner,
                   CudaModelRunner::Create(std::move(gpu_weights),
                                           {.device = options.device,
                                            .kv_budget_bytes = options.kv_budget_bytes}));
  return std::unique_ptr<ModelRunner>(std::move(runner));
}
#else
absl::Status NoCudaBackend() {
  return absl::FailedPreconditionError(
      "backend cuda: this build has no CUDA backend (built without nvcc)");
}
#endif

}  // namespace

absl::Status CheckRunnerHostMemory(const ModelConfig& config, int64_t kv_budget_bytes,
                                   int64_t available_bytes) {
  if (available_bytes < 0) return absl::OkStatus();
  if (kv_budget_bytes > available_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "engine.kv_budget_bytes: ", kv_budget_bytes, " bytes of KV cache exceed the ",
        available_bytes,
        " bytes of memory available to the CPU backend (MemAvailable, or the container's "
        "memory.max); lower the budget"));
  }
  // max_positions <= 2^24 and head_dim <= 512 (ValidateModelConfig): no overflow.
  const int64_t rope = config.max_positions * config.rope.head_dim * int64_t{sizeof(float)};
  if (rope > available_bytes - kv_budget_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the model's context length (", config.max_positions, " positions of head_dim ",
        config.rope.head_dim, ") needs a RoPE table of ", rope, " bytes",
        kv_budget_bytes > 0 ? absl::StrCat(" beside ", kv_budget_bytes, " bytes of KV cache")
                            : std::string(),
        ", more than the ", available_bytes,
        " bytes of memory available (MemAvailable, or the container's memory.max)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ModelRunner>> CreateModelRunner(const ModelWeights* weights,
                                                               const RunnerOptions& options) {
  const Backend backend = ResolveBackend(options.backend);
  if (backend == Backend::kCpu) {
    RETURN_IF_ERROR(CheckHostMemory(weights->config, options.kv_budget_bytes));
    // Its RoPE table covers the model's whole context (up to 2^24 positions) and its KV pool the
    // budget: memory the machine may not have, which must not abort the process.
    try {
      const KvCacheDtype dtype = ConfiguredCpuKvCacheDtype();
      return std::make_unique<CpuModelRunner>(
          weights, KvBlocksForBudget(weights->config, options.kv_budget_bytes, dtype), dtype);
    } catch (const std::bad_alloc&) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "out of memory for the CPU backend: a RoPE table of ", weights->config.max_positions,
          " positions (the model's context length) and ", options.kv_budget_bytes,
          " bytes of KV cache (engine.kv_budget_bytes)"));
    }
  }
#ifdef LAZYATTN_WITH_CUDA_BACKEND
  if (weights->packed()) {
    return absl::InvalidArgumentError(
        "backend cuda uploads fp32 host weights: load them without WeightLoadOptions::packed");
  }
  return CudaRunnerWith(options, [weights] { return CudaModelWeights::Upload(*weights); });
#else
  return NoCudaBackend();
#endif
}

bool IsRandomModelPath(std::string_view path) { return path.substr(0, 7) == "random:"; }

absl::StatusOr<RandomModelSpec> ParseRandomModelPath(std::string_view path) {
  if (!IsRandomModelPath(path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", std::string(path), "\" is not a random:SHAPE[:SEED] model path"));
  }
  std::string_view rest = path.substr(7);
  RandomModelSpec spec;
  const size_t colon = rest.find(':');
  if (colon != std::string_view::npos) {
    const std::string seed(rest.substr(colon + 1));
    if (!absl::SimpleAtoi(seed, &spec.seed)) {
      return absl::InvalidArgumentError(absl::StrCat("random model seed \"", seed,
                                                     "\" is not a non-negative integer"));
    }
    rest = rest.substr(0, colon);
  }
  ASSIGN_OR_RETURN(spec.config, NamedModelShape(rest));
  return spec;
}

std::string RandomModelFingerprint(const RandomModelSpec& spec, Backend resolved_backend) {
  return Sha256Hex(absl::StrCat("random-weights:", spec.config.name, ":", spec.seed, ":",
                                BackendName(resolved_backend)));
}

absl::StatusOr<std::unique_ptr<ModelRunner>> CreateRandomModelRunner(const RandomModelSpec& spec,
                                                                     const RunnerOptions& options) {
  const Backend backend = ResolveBackend(options.backend);
  if (backend == Backend::kCpu) {
    RETURN_IF_ERROR(CheckHostMemory(spec.config, options.kv_budget_bytes));
    // HF's initialisation scale; MakeRandomWeights draws QKV at 4x its stddev.
    auto weights = MakeRandomWeights(spec.config, spec.seed, 0.02f);
    const KvCacheDtype dtype = ConfiguredCpuKvCacheDtype();
    const int64_t blocks = KvBlocksForBudget(spec.config, options.kv_budget_bytes, dtype);
    return std::make_unique<CpuModelRunner>(std::move(weights), blocks, dtype);
  }
#ifdef LAZYATTN_WITH_CUDA_BACKEND
  return CudaRunnerWith(
      options, [&spec] { return CudaModelWeights::Random(spec.config, spec.seed); });
#else
  return NoCudaBackend();
#endif
}

absl::StatusOr<ModelLoadPath> ChooseModelLoadPath(const std::string& path,
                                                  Backend resolved_backend) {
  if (IsRandomModelPath(path)) return ModelLoadPath::kRandom;
  ASSIGN_OR_RETURN(const ModelFormat format, DetectModelFormat(path));
  return format == ModelFormat::kGguf && resolved_backend == Backend::kCuda
             ? ModelLoadPath::kGgufToGpu
             : ModelLoadPath::kHostWeights;
}

absl::StatusOr<ServedModel> LoadServedModel(const std::string& path,
                                            const ServedModelOptions& options,
                                            ModelLoadStage* failed_stage) {
  auto fail = [failed_stage](ModelLoadStage stage, absl::Status status) {
    if (failed_stage != nullptr) *failed_stage = stage;
    return status;
  };
  const Backend backend = ResolveBackend(options.runner.backend);
  const absl::StatusOr<ModelLoadPath> how = ChooseModelLoadPath(path, backend);
  if (!how.ok()) return fail(ModelLoadStage::kModel, how.status());
  ServedModel m;
  absl::StatusOr<std::unique_ptr<ModelRunner>> runner;
  switch (*how) {
    case ModelLoadPath::kRandom: {
      const absl::StatusOr<RandomModelSpec> spec = ParseRandomModelPath(path);
      if (!spec.ok()) return fail(ModelLoadStage::kModel, spec.status());
      m.fingerprint = RandomModelFingerprint(*spec, backend);
      if (options.load_tokenizer) m.tokenizer = MakeByteTokenizer();
      runner = CreateRandomModelRunner(*spec, options.runner);
      break;
    }
    case ModelLoadPath::kHostWeights: {
      // The CPU backend multiplies the matrices in their stored type (quant_linear.h); the GPU
      // upload reads fp32.
      const WeightLoadOptions load{.packed = backend == Backend::kCpu};
      if (options.load_tokenizer) {
        absl::StatusOr<LoadedModel> model = LoadModel(path, load);
        if (!model.ok()) return fail(ModelLoadStage::kModel, model.status());
        m.host_weights = std::move(model->weights);
        m.tokenizer = std::move(model->tokenizer);
      } else {
        absl::StatusOr<std::unique_ptr<ModelWeights>> weights = LoadModelWeights(path, load);
        if (!weights.ok()) return fail(ModelLoadStage::kModel, weights.status());
        m.host_weights = std::move(*weights);
      }
      m.fingerprint = ModelFingerprint(*m.host_weights);
      runner = CreateModelRunner(m.host_weights.get(), options.runner);
      // Only the CPU runner reads the host copy (on cuda fp32, 4 bytes a parameter: 32 GB for
      // an 8B model) after this; a GPU process would otherwise hold it for its whole life.
      if (backend != Backend::kCpu) m.host_weights.reset();
      break;
    }
    case ModelLoadPath::kGgufToGpu: {
#ifdef LAZYATTN_WITH_CUDA_BACKEND
      // Called by CudaRunnerWith once the device is checked and current.
      bool loading_failed = false;
      auto load = [&]() -> absl::StatusOr<std::unique_ptr<CudaModelWeights>> {
        absl::StatusOr<CudaLoadedModel> loaded = LoadGgufModelToGpu(path, options.load_tokenizer);
        if (!loaded.ok()) {
          loading_failed = true;
          return loaded.status();
        }
        m.tokenizer = std::move(loaded->tokenizer);
        m.fingerprint = std::move(loaded->fingerprint);
        return std::move(loaded->weights);
      };
      runner = CudaRunnerWith(options.runner, load);
      if (!runner.ok() && loading_failed) return fail(ModelLoadStage::kModel, runner.status());
#else
      runner = NoCudaBackend();
#endif
      break;
    }
  }
  if (!runner.ok()) return fail(ModelLoadStage::kBackend, runner.status());
  m.runner = std::move(*runner);
  m.config = m.runner->config();
  return m;
}

}  // namespace lazyattn
