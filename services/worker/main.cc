// lazyattn-worker --config FILE.yaml [--listen HOST:PORT] [--metrics HOST:PORT] [--kvdir HOST:PORT]
//                 [--worker-id ID]
//
// Loads the model, serves lazyattn.v1.Worker and publishes the document cache to kvdir until
// SIGTERM or SIGHUP (graceful: WorkerServer::Drain, up to server.drain_timeout_s) or SIGINT
// (immediate). A stop signal while the model loads ends the process at once, exit status 0.
// Once serving it prints
//   lazyattn-worker listening on HOST:PORT
// on stdout (the launcher waits for that line). Exit status: 0 after a clean shutdown, 2 for a bad
// command line, configuration or model, 1 when the server cannot start.
#include <prometheus/gauge.h>
#include <prometheus/registry.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <iostream>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/auth.h"
#include "common/grpc_util.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/server_certificate_role.h"
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

// Accepts "--name value" and "--name=value", each flag at most once (a second --config would
// otherwise silently replace the first). Returns an error message naming the flag, or "".
std::string ParseFlags(int argc, char** argv, Flags* flags, bool* help) {
  std::set<std::string> given;
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
    if (!given.insert(arg).second) return absl::StrCat(arg, ": given twice");
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

// Reads g_signal_pipe on a thread of its own from before the model is loaded, so that a stop
// signal is acted on whatever the main thread is doing. While loading, the first one ends the
// process (see Run); from Starting() on, the first is handed to main() (WaitForStop), and a later
// one during a drain (the first SIGTERM or SIGHUP), or SIGINT then, cuts the drain short
// (WorkerServer::EndDrainNow), as Envoy's and vLLM's second signal does.
class StopSignals {
 public:
  // Starts the reader. Detached: it blocks in read(2) for the life of the process, and main()
  // may return on any path (a joinable std::thread left at exit would terminate the process).
  void Start() {
    std::thread([this] { Run(); }).detach();
  }
  // The model is loaded and the server is about to start: from now on a stop signal no longer
  // ends the process but is kept for WaitForStop.
  void Starting() {
    std::lock_guard<std::mutex> lock(mu_);
    loading_ = false;
  }
  // The first stop signal received after Starting() (at once when it came already).
  int WaitForStop() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return first_ != 0; });
    return first_;
  }
  // The server a second signal ends the drain of (null: none any more; set before it goes
  // away). A second signal that came while it started applies now.
  void SetServer(lazyattn::WorkerServer* server) {
    std::lock_guard<std::mutex> lock(mu_);
    server_ = server;
    if (server_ != nullptr && end_drain_) server_->EndDrainNow();
  }

 private:
  void Run() {
    while (true) {
      unsigned char signal_number = 0;
      const ssize_t n = read(g_signal_pipe[0], &signal_number, 1);
      if (n < 0 && errno == EINTR) continue;
      if (n != 1) return;  // cannot happen: this process holds the write end
      std::lock_guard<std::mutex> lock(mu_);
      if (loading_) {
        // Nothing is served yet: no call can be in flight, the gRPC server, the kvdir stream and
        // the metrics endpoint do not exist, and nothing waits to be written (log lines go out
        // with one write(2) each). The main thread, though, may be deep in the loader (reading
        // files, OpenBLAS threads, CUDA copies and cuBLASLt tuning) for minutes: exit(3) would
        // run static destructors and atexit handlers under it (the CUDA runtime's teardown, the
        // BLAS pool's) and could crash or hang there, so the process ends with _exit, the
        // kernel and the driver freeing its memory and its GPU context.
        lazyattn::LogInfo("worker")
            .Str("signal", strsignal(signal_number))
            .Msg("stopped before serving: the model was still loading");
        _exit(0);
      }
      if (first_ == 0) {
        first_ = signal_number;
        cv_.notify_all();
      } else if ((first_ == SIGTERM || first_ == SIGHUP) && !end_drain_) {
        // The operator does not want to wait for the drain (server.drain_timeout_s): the calls
        // still running end now as at the timeout, so routers fail them over as a drain.
        end_drain_ = true;
        lazyattn::LogWarning("worker")
            .Str("signal", strsignal(signal_number))
            .Msg("second stop signal: ending the drain now");
        if (server_ != nullptr) server_->EndDrainNow();  // non-blocking
      }
    }
  }

  std::mutex mu_;  // before WorkerServer's own lock (EndDrainNow is called under it)
  std::condition_variable cv_;
  bool loading_ = true;
  int first_ = 0;  // the first stop signal after Starting(); 0: none yet
  bool end_drain_ = false;  // a later signal asked to cut the drain short
  lazyattn::WorkerServer* server_ = nullptr;
};

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
  // Its server certificate, before a model load that can take minutes: files that do not pass,
  // or a certificate routers would refuse (not lazyattn://worker/), stop the start now.
  if (absl::Status s = lazyattn::CheckServerCertificateRole(config->server.grpc.tls,
                                                            lazyattn::kRoleWorker, "server.tls.");
      !s.ok()) {
    lazyattn::LogError("worker").Msg(std::string(s.message()));
    return 2;
  }
  // The id kvdir will know it by, before the model load too (the advertised address stands in
  // for it when unset; a listen address's own is checked once it is bound).
  if (!config->kvdir.address.empty() &&
      (!config->server.service.worker_id.empty() || !config->server.advertise_address.empty())) {
    if (absl::Status s = lazyattn::CheckWorkerIdForKvdir(config->server.service.worker_id,
                                                         config->server.advertise_address);
        !s.ok()) {
      lazyattn::LogError("worker").Msg(std::string(s.message()));
      return 2;
    }
  }
  // Its calls to kvdir announce its address and the documents it holds.
  if (absl::Status s = lazyattn::CheckPeerCallSecurity(
          flags.config, "kvdir.tls.ca_file", !config->kvdir.address.empty(),
          !config->kvdir.tls.ca_file.empty(), config->insecure);
      !s.ok()) {
    lazyattn::LogError("worker").Msg(std::string(s.message()));
    return 2;
  }

  if (pipe(g_signal_pipe) != 0) {
    lazyattn::LogError("worker").Str("error", strerror(errno)).Msg("pipe failed");
    return 1;
  }
  // Never destroyed: its reader thread outlives main() (see Start).
  StopSignals& signals = *new StopSignals();
  signals.Start();
  struct sigaction action = {};
  action.sa_handler = OnStopSignal;
  sigemptyset(&action.sa_mask);
  // The signal may land on any thread: the loader's system calls (open(2) of a model on a slow
  // mount, reads) resume instead of failing with EINTR, which would read as a bad model.
  action.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
  // A closed terminal or SSH session (SIGHUP) drains too rather than dropping what is in flight.
  sigaction(SIGHUP, &action, nullptr);
  signal(SIGPIPE, SIG_IGN);

  // /metrics answers while the model loads (minutes for a GPU model on a slow volume), so the
  // scrape's `up` stays 1 and LazyattnWorkerDown does not fire on every start. It serves only
  // the loading gauge; the server's own endpoint takes the same address once the model is in.
  auto loading_registry = std::make_shared<prometheus::Registry>();
  prometheus::BuildGauge()
      .Name("lazyattn_worker_loading")
      .Help("1 while the worker loads its model (this endpoint serves nothing else then)")
      .Register(*loading_registry)
      .Add({})
      .Set(1);
  auto loading_metrics = lazyattn::StartMetricsEndpoint(
      config->server.metrics_address, config->server.metrics_bearer_token_file, loading_registry);
  if (!loading_metrics.ok()) {
    lazyattn::LogError("worker").Msg(std::string(loading_metrics.status().message()));
    return lazyattn::ExitStatusForStartFailure(loading_metrics.status());
  }
  lazyattn::LogInfo("worker")
      .Str("model", config->model_path)
      .Str("backend", config->backend)
      .Msg("loading the model");
  if (config->testing.hold_model_load_ms > 0) {
    // Fault injection: a long load, which a stop signal ends (StopSignals exits at once).
    lazyattn::LogWarning("worker")
        .Int("hold_model_load_ms", config->testing.hold_model_load_ms)
        .Msg("FAULT INJECTION: holding the model load");
    absl::SleepFor(absl::Milliseconds(config->testing.hold_model_load_ms));
  }
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
  signals.Starting();
  loading_metrics->reset();  // frees the address for the server's endpoint
  auto server = lazyattn::WorkerServer::Create(options, std::move(served->runner),
                                               served->fingerprint, served->tokenizer.get());
  if (!server.ok()) {
    lazyattn::LogError("worker").Msg(std::string(server.status().message()));
    return lazyattn::ExitStatusForStartFailure(server.status());
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

  signals.SetServer(server->get());
  const int signal_number = signals.WaitForStop();
  // SIGTERM (Kubernetes, a rolling restart) or SIGHUP (the terminal went away): drain, so no
  // request in flight is lost, until a second signal says not to wait. SIGINT (an operator's
  // Ctrl-C): stop now.
  if (signal_number == SIGTERM || signal_number == SIGHUP) {
    lazyattn::LogInfo("worker").Str("signal", strsignal(signal_number)).Msg("draining");
    if (!(*server)->Drain()) {
      // Drain logged why (server.drain_timeout_s, or a second stop signal).
      lazyattn::LogWarning("worker").Msg("drain unfinished; remaining requests ended");
    }
  } else {
    lazyattn::LogInfo("worker").Str("signal", strsignal(signal_number)).Msg("shutting down");
  }
  signals.SetServer(nullptr);
  server->reset();
  lazyattn::LogInfo("worker").Msg("stopped");
  return 0;
}
