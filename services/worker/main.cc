// lazyattn-worker --config FILE.yaml [--listen HOST:PORT] [--metrics HOST:PORT] [--kvdir HOST:PORT]
//                 [--worker-id ID]
//
// Loads the model, serves lazyattn.v1.Worker and publishes the document cache to kvdir until
// SIGTERM or SIGHUP (graceful: WorkerServer::Drain, up to server.drain_timeout_s) or SIGINT
// (immediate).
// Once serving it prints
//   lazyattn-worker listening on HOST:PORT
// on stdout (the launcher waits for that line). Exit status: 0 after a clean shutdown, 2 for a bad
// command line, configuration or model, 1 when the server cannot start.
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <iostream>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/auth.h"
#include "common/log.h"
#include "common/yaml_config.h"
#include "kernels/include/cpu_threads.h"
#include "kernels/include/quant_linear.h"
#include "services/worker/engine/fault_injection.h"
#include "services/worker/engine/runner_factory.h"
#include "services/worker/model/model_loader.h"
#include "services/worker/server/worker_config.h"
#include "services/worker/server/worker_server.h"

namespace {

constexpr char kUsage[] =
    "usage: lazyattn-worker --config FILE.yaml [--listen HOST:PORT] [--metrics HOST:PORT]\n"
    "                       [--kvdir HOST:PORT] [--worker-id ID] [--cpu-threads N]\n"
    "                       [--cpu-activations int8|fp32] [--cpu-kv-cache f16|f32]\n"
    "  --config     the YAML configuration (keys: docs/worker.md)\n"
    "  --listen     overrides server.listen (port 0: the OS picks one)\n"
    "  --metrics    overrides metrics.listen (\"\" turns the /metrics endpoint off)\n"
    "  --kvdir      overrides kvdir.address (\"\" runs standalone)\n"
    "  --worker-id  overrides worker.id\n"
    "  --cpu-threads overrides engine.cpu_threads (0: the CPU budget)\n"
    "  --cpu-activations overrides engine.cpu_activations (decode products' inputs)\n"
    "  --cpu-kv-cache overrides engine.cpu_kv_cache (cpu backend's KV element type)\n";

struct Flag {
  bool set = false;
  std::string value;
};

struct Flags {
  std::string config;
  Flag listen, metrics, kvdir, worker_id, cpu_threads, cpu_activations, cpu_kv_cache;
};

// Accepts "--name value" and "--name=value". Returns an error message naming the flag, or "".
std::string ParseFlags(int argc, char** argv, Flags* flags, bool* help) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      *help = true;
      return "";
    }
    std::string value;
    bool has_value = false;
    if (const size_t eq = arg.find('='); arg.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
      has_value = true;
    }
    std::string* target = nullptr;
    Flag* flag = nullptr;
    if (arg == "--config") {
      target = &flags->config;
    } else if (arg == "--listen") {
      flag = &flags->listen;
    } else if (arg == "--metrics") {
      flag = &flags->metrics;
    } else if (arg == "--kvdir") {
      flag = &flags->kvdir;
    } else if (arg == "--worker-id") {
      flag = &flags->worker_id;
    } else if (arg == "--cpu-threads") {
      flag = &flags->cpu_threads;
    } else if (arg == "--cpu-activations") {
      flag = &flags->cpu_activations;
    } else if (arg == "--cpu-kv-cache") {
      flag = &flags->cpu_kv_cache;
    } else {
      return absl::StrCat("unknown flag ", arg);
    }
    if (!has_value) {
      if (i + 1 >= argc) return absl::StrCat(arg, ": missing value");
      value = argv[++i];
    }
    if (flag != nullptr) {
      flag->set = true;
      target = &flag->value;
    }
    *target = value;
  }
  if (flags->config.empty()) return "--config: required";
  if (flags->listen.set && flags->listen.value.empty()) return "--listen: must not be empty";
  return "";
}

// "HOST:PORT" with the bound port in place of the configured one (which may be 0).
std::string WithPort(const std::string& address, int port) {
  const size_t colon = address.rfind(':');
  const std::string host = colon == std::string::npos ? address : address.substr(0, colon);
  return absl::StrCat(host, ":", port);
}

// SIGTERM/SIGHUP/SIGINT -> one byte on a pipe that main() waits on. A handler rather than sigwait:
// the BLAS library starts its threads before main() could block the signals in them.
int g_signal_pipe[2] = {-1, -1};

// The model of model.path on the configured backend (LoadServedModel: a GGUF file on cuda is
// dequantized on the GPU without an fp32 host copy). Errors name the key they come from.
// `stage` says which step failed.
absl::StatusOr<lazyattn::ServedModel> LoadWorkerModel(const lazyattn::WorkerConfig& config,
                                                      lazyattn::ModelLoadStage& stage) {
  const lazyattn::ServedModelOptions options{
      .runner = {.backend = *lazyattn::ParseBackend(config.backend),
                 .kv_budget_bytes = config.kv_budget_bytes}};
  auto served = lazyattn::LoadServedModel(config.model_path, options, &stage);
  if (!served.ok()) {
    const absl::Status& s = served.status();
    const char* key = stage == lazyattn::ModelLoadStage::kModel ? "model.path" : "backend";
    return absl::Status(s.code(), absl::StrCat(key, ": ", s.message()));
  }
  return served;
}

void OnStopSignal(int signal_number) {
  const unsigned char b = static_cast<unsigned char>(signal_number);
  const int saved = errno;
  [[maybe_unused]] ssize_t n = write(g_signal_pipe[1], &b, 1);
  errno = saved;
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  bool help = false;
  if (const std::string error = ParseFlags(argc, argv, &flags, &help); !error.empty()) {
    std::cerr << "lazyattn-worker: " << error << "\n" << kUsage;
    return 2;
  }
  if (help) {
    std::cout << kUsage;
    return 0;
  }

  lazyattn::YamlConfig yaml;
  absl::Status status = yaml.LoadFile(flags.config);
  absl::StatusOr<lazyattn::WorkerConfig> config =
      status.ok() ? lazyattn::WorkerConfigFromYaml(yaml)
                  : absl::StatusOr<lazyattn::WorkerConfig>(status);
  if (!config.ok()) {
    lazyattn::LogError("worker").Msg(std::string(config.status().message()));
    return 2;
  }
  lazyattn::ConfigureLogging(config->log);
  if (flags.listen.set) config->server.grpc.listen_address = flags.listen.value;
  if (flags.metrics.set) config->server.metrics_address = flags.metrics.value;
  if (flags.kvdir.set) config->kvdir.address = flags.kvdir.value;
  if (flags.worker_id.set) config->server.service.worker_id = flags.worker_id.value;
  if (flags.cpu_threads.set) {
    int n = -1;
    if (!absl::SimpleAtoi(flags.cpu_threads.value, &n) || n < 0 || n > 256) {
      lazyattn::LogError("worker").Msg("--cpu-threads: must be an integer in [0, 256]");
      return 2;
    }
    config->cpu_threads = n;
  }
  lazyattn::SetCpuKernelThreads(config->cpu_threads);
  if (flags.cpu_activations.set &&
      !lazyattn::ParseCpuActivations(flags.cpu_activations.value, &config->cpu_activations)) {
    lazyattn::LogError("worker").Msg("--cpu-activations: must be int8 or fp32");
    return 2;
  }
  lazyattn::SetCpuActivations(config->cpu_activations);
  if (flags.cpu_kv_cache.set &&
      !lazyattn::ParseKvCacheDtype(flags.cpu_kv_cache.value, &config->cpu_kv_cache)) {
    lazyattn::LogError("worker").Msg("--cpu-kv-cache: must be f16 or f32");
    return 2;
  }
  lazyattn::SetCpuKvCacheDtype(config->cpu_kv_cache);
  // Mutual TLS (server.tls.ca_file) is what lets the worker check that its caller is a router.
  if (absl::Status s = lazyattn::CheckTransportSecurity(
          "lazyattn-worker", flags.config, !config->server.grpc.tls.ca_file.empty(),
          config->insecure);
      !s.ok()) {
    lazyattn::LogError("worker").Msg(std::string(s.message()));
    return 2;
  }

  if (pipe(g_signal_pipe) != 0) {
    lazyattn::LogError("worker").Str("error", strerror(errno)).Msg("pipe failed");
    return 1;
  }
  struct sigaction action = {};
  action.sa_handler = OnStopSignal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
  // A closed terminal or SSH session (SIGHUP) drains too rather than dropping what is in flight.
  sigaction(SIGHUP, &action, nullptr);
  signal(SIGPIPE, SIG_IGN);

  lazyattn::LogInfo("worker")
      .Str("model", config->model_path)
      .Str("backend", config->backend)
      .Msg("loading the model");
  lazyattn::ModelLoadStage stage = lazyattn::ModelLoadStage::kModel;
  auto served = LoadWorkerModel(*config, stage);
  if (!served.ok()) {
    // model.path naming a missing, malformed or unsupported file is a configuration error, as is
    // a backend the runner refuses as invalid; running out of memory or a device failure is not.
    const absl::StatusCode code = served.status().code();
    const bool model_file = stage == lazyattn::ModelLoadStage::kModel &&
                            lazyattn::IsModelFileError(served.status());
    const bool bad_model = model_file || code == absl::StatusCode::kInvalidArgument ||
                           code == absl::StatusCode::kNotFound;
    lazyattn::LogError("worker").Msg(std::string(served.status().message()));
    return bad_model ? 2 : 1;
  }
  lazyattn::LogInfo("worker").Str("backend", served->runner->backend_name()).Msg("model loaded");
  lazyattn::WorkerServerOptions options = lazyattn::ServerOptionsFor(*config, served->config);
  options.engine.num_kv_blocks = served->runner->num_kv_blocks();
  if (config->testing.any()) {
    // Never in production: these keys make a healthy worker fail on purpose.
    lazyattn::LogWarning("worker")
        .Str("testing", config->testing.Describe())
        .Msg("FAULT INJECTION IS ON: this worker will fail steps or abort on purpose; remove the "
             "testing: section outside fault-injection tests");
  }
  served->runner = lazyattn::WithFaultInjection(std::move(served->runner), config->testing);
  auto server = lazyattn::WorkerServer::Create(options, std::move(served->runner),
                                               served->fingerprint, served->tokenizer.get());
  if (!server.ok()) {
    lazyattn::LogError("worker").Msg(std::string(server.status().message()));
    return 1;
  }
  lazyattn::LogInfo("worker")
      .Str("worker", (*server)->worker_id())
      .Int("kv_blocks", options.engine.num_kv_blocks)
      .Str("kvdir", options.kvdir ? options.kvdir->address : std::string("none (standalone)"))
      .Msg("serving");
  if ((*server)->metrics_port() != 0) {
    std::cout << "lazyattn-worker metrics on http://"
              << WithPort(options.metrics_address, (*server)->metrics_port()) << "/metrics"
              << std::endl;
  }
  std::cout << "lazyattn-worker listening on "
            << WithPort(options.grpc.listen_address, (*server)->port()) << std::endl;

  unsigned char signal_number = 0;
  while (read(g_signal_pipe[0], &signal_number, 1) < 0 && errno == EINTR) {
  }
  // SIGTERM (Kubernetes, a rolling restart) or SIGHUP (the terminal went away): drain, so no
  // request in flight is lost. SIGINT (an operator's Ctrl-C): stop now.
  if (signal_number == SIGTERM || signal_number == SIGHUP) {
    lazyattn::LogInfo("worker").Str("signal", strsignal(signal_number)).Msg("draining");
    if (!(*server)->Drain()) {
      lazyattn::LogWarning("worker").Msg(
          "server.drain_timeout_s passed; remaining requests cancelled");
    }
  } else {
    lazyattn::LogInfo("worker").Str("signal", strsignal(signal_number)).Msg("shutting down");
  }
  server->reset();
  lazyattn::LogInfo("worker").Msg("stopped");
  return 0;
}
