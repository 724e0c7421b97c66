#include "services/worker/engine/runner_factory.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "services/worker/engine/cpu_runner.h"
#include "services/worker/engine/kv_cache_cpu.h"

#ifdef LAZYATTN_WITH_CUDA_BACKEND
#include "kernels/cuda/device_info.h"
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

absl::StatusOr<std::unique_ptr<ModelRunner>> CreateModelRunner(const ModelWeights* weights,
                                                               const RunnerOptions& options) {
  const Backend backend = ResolveBackend(options.backend);
  if (backend == Backend::kCpu) {
    return std::make_unique<CpuModelRunner>(
        weights, KvBlocksForBudget(weights->config, options.kv_budget_bytes));
  }
#ifdef LAZYATTN_WITH_CUDA_BACKEND
  if (CudaDeviceCount() <= options.device) {
    return absl::UnavailableError(
        absl::StrCat("backend cuda: no CUDA device ", options.device, " is visible"));
  }
  ASSIGN_OR_RETURN(auto gpu_weights, CudaModelWeights::Upload(*weights));
  ASSIGN_OR_RETURN(auto runner,
                   CudaModelRunner::Create(std::move(gpu_weights),
                                           {.device = options.device,
                                            .kv_budget_bytes = options.kv_budget_bytes}));
  return std::unique_ptr<ModelRunner>(std::move(runner));
#else
  return absl::FailedPreconditionError(
      "backend cuda: this build has no CUDA backend (built without nvcc)");
#endif
}

}  // namespace lazyattn
