// lazyattn-worker's YAML configuration (every key, default and meaning: docs/worker.md), read
// into WorkerConfig and validated in one place. The KV block count depends on the model, so the
// budget in bytes is kept here and turned into blocks once the model is loaded (KvBlocksForBudget).
#ifndef LAZYATTN_SERVICES_WORKER_SERVER_WORKER_CONFIG_H_
#define LAZYATTN_SERVICES_WORKER_SERVER_WORKER_CONFIG_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/yaml_config.h"
#include "kernels/include/quant_linear.h"
#include "services/worker/engine/fault_injection.h"
#include "services/worker/engine/kv_cache_cpu.h"
#include "common/log.h"
#include "services/worker/model/model_config.h"
#include "services/worker/server/worker_server.h"

namespace lazyattn {

struct WorkerConfig {
  std::string model_path;
  LogOptions log;  // log.level, log.format
  std::string backend = "cpu";  // what runs the model: "cpu", "cuda" or "auto" (runner_factory.h)
  int64_t kv_budget_bytes = int64_t{512} << 20;
  // engine.cpu_threads: threads of the CPU kernels (and OpenBLAS); 0 = the CPU budget
  // (DefaultCpuKernelThreads: affinity cores, cgroup quota, OPENBLAS_NUM_THREADS / OMP_NUM_THREADS).
  int cpu_threads = 0;
  // engine.cpu_activations: "int8" (default) or "fp32", the inputs of the cpu backend's decode
  // products (quant_linear.h); applied process-wide by main (SetCpuActivations).
  CpuActivations cpu_activations = CpuActivations::kInt8;
  // engine.cpu_kv_cache: "f16" (default) or "f32", the element type of the cpu backend's KV pools
  // (kv_cache_cpu.h); applied process-wide by main (SetCpuKvCacheDtype) before the runner is made.
  KvCacheDtype cpu_kv_cache = KvCacheDtype::kF16;
  // Everything else; engine.num_kv_blocks and kvdir are filled in by ServerOptionsFor.
  WorkerServerOptions server;
  // kvdir.address empty: standalone (the --kvdir flag may set it).
  KvdirPublisherOptions kvdir;
  // `insecure: true`: plaintext without authorization, accepted only when said (main refuses to
  // start without mutual TLS otherwise; common/auth.h).
  bool insecure = false;
  // `testing:` keys: fault injection for tests (main wraps the runner and warns at start).
  FaultInjectionOptions testing;
};

// InvalidArgument naming the key (and the bad value) for a wrong type, an out-of-range value, an
// inconsistent TLS setting, an unknown backend or an unknown key. backend `cuda` is an error in a
// build without the CUDA backend.
absl::StatusOr<WorkerConfig> WorkerConfigFromYaml(const YamlConfig& config);

// The server's options for a loaded model: KV blocks from the byte budget, and the publisher when
// a kvdir address is set.
WorkerServerOptions ServerOptionsFor(const WorkerConfig& config, const ModelConfig& model);

}  // namespace lazyattn

#endif  // LAZYATTN_SERVICES_WORKER_SERVER_WORKER_CONFIG_H_
