// lazyattn-kvdir --config FILE.yaml [--listen HOST:PORT] [--metrics HOST:PORT]
//
// Serves the KV directory until SIGTERM, SIGHUP or SIGINT. Once serving it prints
//   lazyattn-kvdir listening on HOST:PORT
// on stdout (the launcher waits for that line). Exit status: 0 after a clean shutdown, 2 for a
// bad command line or configuration, 1 when the server cannot start.
#include <signal.h>

#include <cstring>
#include <iostream>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/auth.h"
#include "common/grpc_util.h"
#include "common/log.h"
#include "common/yaml_config.h"
#include "services/kvdir/kvdir_config.h"
#include "services/kvdir/server/kvdir_server.h"

namespace {

constexpr char kUsage[] =
    "usage: lazyattn-kvdir --config FILE.yaml [--listen HOST:PORT] [--metrics HOST:PORT]\n"
    "  --config   the YAML configuration (keys: docs/kvdir.md)\n"
    "  --listen   overrides server.listen (port 0: the OS picks one)\n"
    "  --metrics  overrides metrics.listen (\"\" turns the /metrics endpoint off)\n";

struct Flags {
  std::string config;
  bool has_listen = false;
  std::string listen;
  bool has_metrics = false;
  std::string metrics;
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
    if (arg == "--config") {
      target = &flags->config;
    } else if (arg == "--listen") {
      target = &flags->listen;
      flags->has_listen = true;
    } else if (arg == "--metrics") {
      target = &flags->metrics;
      flags->has_metrics = true;
    } else {
      return absl::StrCat("unknown flag ", arg);
    }
    if (!given.insert(arg).second) return absl::StrCat(arg, ": given twice");
    if (!has_value) {
      if (i + 1 >= argc) return absl::StrCat(arg, ": missing value");
      value = argv[++i];
    }
    *target = value;
  }
  if (flags->config.empty()) return "--config: required";
  return "";
}

// "HOST:PORT" with the bound port in place of the configured one (which may be 0).
std::string WithPort(const std::string& address, int port) {
  const size_t colon = address.rfind(':');
  const std::string host = colon == std::string::npos ? address : address.substr(0, colon);
  return absl::StrCat(host, ":", port);
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  bool help = false;
  if (const std::string error = ParseFlags(argc, argv, &flags, &help); !error.empty()) {
    std::cerr << "lazyattn-kvdir: " << error << "\n" << kUsage;
    return 2;
  }
  if (help) {
    std::cout << kUsage;
    return 0;
  }

  lazyattn::YamlConfig config;
  absl::Status status = config.LoadFile(flags.config);
  absl::StatusOr<lazyattn::kvdir::KvdirOptions> options =
      status.ok() ? lazyattn::kvdir::KvdirOptionsFromYaml(config)
                  : absl::StatusOr<lazyattn::kvdir::KvdirOptions>(status);
  if (!options.ok()) {
    lazyattn::LogError("kvdir").Msg(std::string(options.status().message()));
    return 2;
  }
  lazyattn::ConfigureLogging(options->log);
  if (flags.has_listen) {
    if (flags.listen.empty()) {
      lazyattn::LogError("kvdir").Msg("--listen: must not be empty");
      return 2;
    }
    options->listen_address = flags.listen;
  }
  if (flags.has_metrics) options->metrics_address = flags.metrics;
  // Mutual TLS (ca_file) is what lets the directory check who publishes; server TLS alone is not.
  if (absl::Status s = lazyattn::CheckTransportSecurity("lazyattn-kvdir", flags.config,
                                                        !options->tls.ca_file.empty(),
                                                        options->insecure);
      !s.ok()) {
    lazyattn::LogError("kvdir").Msg(std::string(s.message()));
    return 2;
  }

  // Block the stop signals before any thread starts (gRPC's and the sweeper inherit the mask), so
  // only sigwait below receives them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  auto server = lazyattn::kvdir::KvdirServer::Create(*options);
  if (!server.ok()) {
    lazyattn::LogError("kvdir").Msg(std::string(server.status().message()));
    return lazyattn::ExitStatusForStartFailure(server.status());
  }
  if ((*server)->metrics_port() != 0) {
    std::cout << "lazyattn-kvdir metrics on http://"
              << WithPort(options->metrics_address, (*server)->metrics_port()) << "/metrics"
              << std::endl;
  }
  std::cout << "lazyattn-kvdir listening on "
            << WithPort(options->listen_address, (*server)->port()) << std::endl;

  int signal_number = 0;
  sigwait(&stop_signals, &signal_number);
  lazyattn::LogInfo("kvdir").Str("signal", strsignal(signal_number)).Msg("shutting down");
  server->reset();
  lazyattn::LogInfo("kvdir").Msg("stopped");
  return 0;
}
