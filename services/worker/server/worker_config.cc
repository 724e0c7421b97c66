#include "services/worker/server/worker_config.h"

#include <algorithm>
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/grpc_util.h"
#include "common/log.h"
#include "common/request_validator.h"
#include "common/status_macros.h"
#include "services/worker/engine/kv_cache_cpu.h"
#include "services/worker/engine/runner_factory.h"

namespace lazyattn {
namespace {

absl::StatusOr<int64_t> IntInRange(const YamlConfig& config, const std::string& key,
                                   int64_t fallback, int64_t lo, int64_t hi) {
  ASSIGN_OR_RETURN(const int64_t value, config.Int(key, fallback));
  if (value < lo || value > hi) {
    return absl::InvalidArgumentError(absl::StrCat(config.source(), ": ", key, ": must be in [",
                                                   lo, ", ", hi, "], got ", value));
  }
  return value;
}

absl::Status Error(const YamlConfig& config, const std::string& key, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(config.source(), ": ", key, ": ", what));
}

}  // namespace

WorkerServerOptions ServerOptionsFor(const WorkerConfig& config, const ModelConfig& model) {
  WorkerServerOptions o = config.server;
  // The cpu backend's pool for the budget; the worker replaces it with the runner's own count
  // once the runner exists (main.cc), which is what any backend actually holds.
  o.engine.num_kv_blocks = KvBlocksForBudget(model, config.kv_budget_bytes, config.cpu_kv_cache);
  // The metrics' model label: the model file's (or folder's) name.
  std::string name = config.model_path;
  while (name.size() > 1 && name.back() == '/') name.pop_back();
  o.model_name = name.substr(name.rfind('/') == std::string::npos ? 0 : name.rfind('/') + 1);
  if (!config.kvdir.address.empty()) {
    o.kvdir = config.kvdir;
    o.kvdir->max_message_bytes = o.grpc.max_message_bytes;
  }
  return o;
}

absl::StatusOr<WorkerConfig> WorkerConfigFromYaml(const YamlConfig& config) {
  WorkerConfig c;
  WorkerServerOptions& o = c.server;

  // Model and backend.
  ASSIGN_OR_RETURN(c.model_path, config.String("model.path", ""));
  if (c.model_path.empty()) return Error(config, "model.path", "required");
  ASSIGN_OR_RETURN(o.service.model_name, config.String("model.name", ""));
  ASSIGN_OR_RETURN(c.backend, config.String("backend", "cpu"));
  if (c.backend != "cpu" && c.backend != "cuda" && c.backend != "auto") {
    return Error(config, "backend",
                 absl::StrCat("unknown backend \"", c.backend, "\" (expected cpu, cuda or auto)"));
  }
  if (c.backend == "cuda" && !CudaBackendBuiltIn()) {
    return Error(config, "backend",
                 "\"cuda\" is not built into this worker (it was compiled without nvcc); use "
                 "\"cpu\" or \"auto\"");
  }

  // Identity.
  ASSIGN_OR_RETURN(o.service.worker_id, config.String("worker.id", ""));
  ASSIGN_OR_RETURN(o.advertise_address, config.String("worker.advertise_address", ""));
  // Routers dial it as written: gRPC would take port 99999 modulo 65536, a missing port as 443.
  if (!o.advertise_address.empty()) {
    if (absl::Status s = CheckAddressPort(o.advertise_address, /*listening=*/false); !s.ok()) {
      return Error(config, "worker.advertise_address", std::string(s.message()));
    }
  }

  // Socket and TLS.
  ASSIGN_OR_RETURN(c.insecure, config.Bool("insecure", false));
  ASSIGN_OR_RETURN(o.grpc.listen_address, config.String("server.listen", "127.0.0.1:7200"));
  if (o.grpc.listen_address.empty()) return Error(config, "server.listen", "must not be empty");
  ASSIGN_OR_RETURN(o.grpc.tls.cert_file, config.String("server.tls.cert_file", ""));
  ASSIGN_OR_RETURN(o.grpc.tls.key_file, config.String("server.tls.key_file", ""));
  ASSIGN_OR_RETURN(o.grpc.tls.ca_file, config.String("server.tls.ca_file", ""));
  if (o.grpc.tls.cert_file.empty() != o.grpc.tls.key_file.empty()) {
    return Error(config, "server.tls", "cert_file and key_file must be set together");
  }
  if (!o.grpc.tls.ca_file.empty() && o.grpc.tls.cert_file.empty()) {
    return Error(config, "server.tls.ca_file", "needs cert_file and key_file (server TLS)");
  }
  ASSIGN_OR_RETURN(const int64_t tls_refresh_s,
                   IntInRange(config, "server.tls.refresh_interval_s", 60, 1, 86400));
  o.grpc.tls.refresh_interval_s = static_cast<int>(tls_refresh_s);
  ASSIGN_OR_RETURN(o.grpc.reflection, config.Bool("server.reflection", false));

  // Engine.
  ASSIGN_OR_RETURN(c.kv_budget_bytes, IntInRange(config, "engine.kv_budget_bytes",
                                                 c.kv_budget_bytes, 1 << 20, int64_t{1} << 40));
  ASSIGN_OR_RETURN(const int64_t cpu_threads,
                   IntInRange(config, "engine.cpu_threads", c.cpu_threads, 0, 256));
  c.cpu_threads = static_cast<int>(cpu_threads);
  ASSIGN_OR_RETURN(const std::string activations,
                   config.String("engine.cpu_activations", "int8"));
  if (!ParseCpuActivations(activations, &c.cpu_activations)) {
    return Error(config, "engine.cpu_activations",
                 absl::StrCat("expected int8 or fp32, got \"", activations, "\""));
  }
  ASSIGN_OR_RETURN(const std::string kv_cache, config.String("engine.cpu_kv_cache", "f16"));
  if (!ParseKvCacheDtype(kv_cache, &c.cpu_kv_cache)) {
    return Error(config, "engine.cpu_kv_cache",
                 absl::StrCat("expected f16 or f32, got \"", kv_cache, "\""));
  }
  ASSIGN_OR_RETURN(const int64_t batch, IntInRange(config, "engine.max_batch_tokens",
                                                   o.engine.max_batch_tokens, 1, 1 << 20));
  o.engine.max_batch_tokens = static_cast<int>(batch);
  // At most 65535: the CUDA decode kernels give each decode row one grid row (grid.y's bound).
  ASSIGN_OR_RETURN(const int64_t running,
                   IntInRange(config, "engine.max_running", o.engine.max_running, 1, 65535));
  o.engine.max_running = static_cast<int>(running);
  ASSIGN_OR_RETURN(o.engine.pipeline_decode,
                   config.Bool("engine.pipeline_decode", o.engine.pipeline_decode));
  o.engine.num_kv_blocks = 0;  // from kv_budget_bytes once the model is loaded
  ASSIGN_OR_RETURN(const int64_t deadline_s,
                   IntInRange(config, "engine.default_deadline_s",
                              absl::ToInt64Seconds(o.engine.default_deadline), 1, 86400 * 7));
  o.engine.default_deadline = absl::Seconds(deadline_s);
  ASSIGN_OR_RETURN(const int64_t max_waiting,
                   IntInRange(config, "engine.max_waiting_requests",
                              o.engine.max_waiting_requests, 1, 1 << 20));
  o.engine.max_waiting_requests = static_cast<int>(max_waiting);
  ASSIGN_OR_RETURN(o.engine.max_queued_tokens,
                   IntInRange(config, "engine.max_queued_tokens", o.engine.max_queued_tokens,
                              1, int64_t{1} << 32));
  ASSIGN_OR_RETURN(const int64_t prep_threads, IntInRange(config, "engine.prep_threads",
                                                          o.service.prep.threads, 1, 256));
  o.service.prep.threads = static_cast<int>(prep_threads);
  ASSIGN_OR_RETURN(const int64_t pending,
                   IntInRange(config, "engine.max_pending_preparations",
                              o.service.prep.max_pending, 1, 1 << 20));
  o.service.prep.max_pending = static_cast<int>(pending);
  ASSIGN_OR_RETURN(o.service.prep.max_pending_bytes,
                   IntInRange(config, "engine.max_pending_preparation_bytes",
                              o.service.prep.max_pending_bytes, 1 << 20, int64_t{1} << 40));
  ASSIGN_OR_RETURN(const int64_t step_failures,
                   IntInRange(config, "engine.max_consecutive_step_failures",
                              o.engine.max_consecutive_step_failures, 1, 1'000'000));
  o.engine.max_consecutive_step_failures = static_cast<int>(step_failures);

  // Limits: the router's request limits (the same keys and validator), then the worker's own.
  ASSIGN_OR_RETURN(o.service.limits, ApiLimitsFromYaml(config, o.service.limits));
  ASSIGN_OR_RETURN(const int64_t docs, IntInRange(config, "limits.max_documents",
                                                  o.limits.max_documents, 1, 4096));
  o.limits.max_documents = static_cast<int>(docs);
  o.service.limits.max_documents = o.limits.max_documents;
  ASSIGN_OR_RETURN(const int64_t msg, IntInRange(config, "limits.max_message_bytes",
                                                 o.grpc.max_message_bytes, 4096, INT32_MAX));
  o.grpc.max_message_bytes = static_cast<int>(msg);
  // Within limits.max_tokens, as an explicit max_tokens must be (the router bounds the stream
  // of a request without one by that limit when a worker reported no context); unset, the
  // default is lowered to the limit where the limit is smaller.
  ASSIGN_OR_RETURN(const int64_t def_tokens,
                   IntInRange(config, "limits.default_max_tokens",
                              std::min(o.service.default_max_tokens, o.service.limits.max_tokens),
                              1, o.service.limits.max_tokens));
  o.service.default_max_tokens = static_cast<int>(def_tokens);
  ASSIGN_OR_RETURN(const int64_t buffered,
                   IntInRange(config, "limits.max_buffered_tokens", o.service.max_buffered_tokens,
                              1, 1 << 20));
  o.service.max_buffered_tokens = static_cast<int>(buffered);
  ASSIGN_OR_RETURN(const int64_t grace_ms, IntInRange(config, "limits.shutdown_grace_ms",
                                                      5000, 0, 600'000));
  o.shutdown_grace = absl::Milliseconds(grace_ms);
  ASSIGN_OR_RETURN(const int64_t drain_s,
                   IntInRange(config, "server.drain_timeout_s", 30, 0, 3600));
  o.drain_timeout = absl::Seconds(drain_s);
  ASSIGN_OR_RETURN(const int64_t announce_ms,
                   IntInRange(config, "server.drain_announce_ms",
                              absl::ToInt64Milliseconds(o.drain_announce), 0, 60'000));
  o.drain_announce = absl::Milliseconds(announce_ms);

  // kvdir (optional).
  KvdirPublisherOptions& k = c.kvdir;
  ASSIGN_OR_RETURN(k.address, config.String("kvdir.address", ""));
  ASSIGN_OR_RETURN(const int64_t lease, IntInRange(config, "kvdir.lease_ms", 3000, 30, 3'600'000));
  k.lease = absl::Milliseconds(lease);
  ASSIGN_OR_RETURN(const int64_t min_ms,
                   IntInRange(config, "kvdir.reconnect_min_ms", 100, 1, 600'000));
  ASSIGN_OR_RETURN(const int64_t max_ms,
                   IntInRange(config, "kvdir.reconnect_max_ms", 5000, 1, 600'000));
  if (max_ms < min_ms) {
    return Error(config, "kvdir.reconnect_max_ms",
                 absl::StrCat(max_ms, " is below kvdir.reconnect_min_ms ", min_ms));
  }
  k.min_backoff = absl::Milliseconds(min_ms);
  k.max_backoff = absl::Milliseconds(max_ms);
  ASSIGN_OR_RETURN(const int64_t queued, IntInRange(config, "kvdir.max_queued_events",
                                                    k.max_queued_events, 1, 1 << 24));
  k.max_queued_events = static_cast<int>(queued);
  ASSIGN_OR_RETURN(k.tls.ca_file, config.String("kvdir.tls.ca_file", ""));
  ASSIGN_OR_RETURN(k.tls.cert_file, config.String("kvdir.tls.cert_file", ""));
  ASSIGN_OR_RETURN(k.tls.key_file, config.String("kvdir.tls.key_file", ""));
  if (k.tls.cert_file.empty() != k.tls.key_file.empty()) {
    return Error(config, "kvdir.tls", "cert_file and key_file must be set together");
  }
  if (!k.tls.cert_file.empty() && k.tls.ca_file.empty()) {
    return Error(config, "kvdir.tls.cert_file", "client certificates need ca_file (TLS)");
  }
  k.tls.refresh_interval_s = o.grpc.tls.refresh_interval_s;  // one watch interval, as the router

  // Metrics.
  ASSIGN_OR_RETURN(o.metrics_address, config.String("metrics.listen", "127.0.0.1:9200"));
  ASSIGN_OR_RETURN(o.metrics_bearer_token_file, config.String("metrics.bearer_token_file", ""));
  ASSIGN_OR_RETURN(c.log, ReadLogOptions(config));

  // Fault injection (fault_injection.h), for tests only; main warns loudly when any is set.
  FaultInjectionOptions& t = c.testing;
  ASSIGN_OR_RETURN(t.fail_steps_after,
                   IntInRange(config, "testing.fail_steps_after", -1, -1, int64_t{1} << 40));
  ASSIGN_OR_RETURN(t.sticky_error_after,
                   IntInRange(config, "testing.sticky_error_after", -1, -1, int64_t{1} << 40));
  ASSIGN_OR_RETURN(t.abort_on_prompt_marker, config.String("testing.abort_on_prompt_marker", ""));
  ASSIGN_OR_RETURN(t.hold_model_load_ms,
                   IntInRange(config, "testing.hold_model_load_ms", 0, 0, 600'000));
  o.service.abort_on_prompt_marker = t.abort_on_prompt_marker;

  RETURN_IF_ERROR(config.Finish());
  return c;
}

}  // namespace lazyattn
