// lazyattn-router --config FILE.yaml [--listen HOST:PORT] [--metrics HOST:PORT] [--kvdir HOST:PORT]
//                 [--http HOST:PORT]
//
// The public entry point of a LazyAttention cluster (docs/router.md). Exits non-zero with a
// message naming the key for a bad configuration; prints "lazyattn-router listening on HOST:PORT"
// once serving (and "lazyattn-router http on http[s]://HOST:PORT" with the HTTP API); shuts down cleanly on SIGTERM, SIGHUP or SIGINT. Exit status 2: bad command line or
// configuration; 1: the server could not start.
#include <pthread.h>

#include <csignal>
#include <cstring>
#include <iostream>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include "common/auth.h"
#include "common/grpc_util.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/yaml_config.h"
#include "services/router/http/http_server.h"
#include "services/router/server/router_config.h"
#include "services/router/server/router_server.h"

namespace {

constexpr char kUsage[] =
    "usage: lazyattn-router --config FILE.yaml [--listen HOST:PORT] [--metrics HOST:PORT]\n"
    "                       [--kvdir HOST:PORT] [--http HOST:PORT]\n"
    "  --config   the router's YAML configuration (keys: docs/router.md)\n"
    "  --listen   overrides server.listen\n"
    "  --metrics  overrides metrics.listen (empty: no metrics endpoint)\n"
    "  --kvdir    overrides kvdir.address (empty: no directory)\n"
    "  --http     overrides http.listen (empty: no HTTP API)\n";

std::string HostOf(const std::string& address) {
  const size_t colon = address.rfind(':');
  return colon == std::string::npos ? address : address.substr(0, colon);
}

}  // namespace

int main(int argc, char** argv) {
  std::string config_path;
  lazyattn::router::FlagOverrides overrides;
  // Each flag at most once: a second --config would otherwise silently replace the first.
  std::set<std::string> given;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::cout << kUsage;
      return 0;
    }
    std::string name = arg, value;
    bool has_value = false;
    if (const size_t eq = arg.find('='); arg.rfind("--", 0) == 0 && eq != std::string::npos) {
      name = arg.substr(0, eq);
      value = arg.substr(eq + 1);
      has_value = true;
    }
    if (name != "--config" && name != "--listen" && name != "--metrics" && name != "--kvdir" &&
        name != "--http") {
      std::cerr << "lazyattn-router: unknown argument " << arg << "\n" << kUsage;
      return 2;
    }
    if (!given.insert(name).second) {
      std::cerr << "lazyattn-router: " << name << ": given twice\n" << kUsage;
      return 2;
    }
    if (!has_value) {
      if (i + 1 >= argc) {
        std::cerr << "lazyattn-router: " << name << " needs a value\n" << kUsage;
        return 2;
      }
      value = argv[++i];
    }
    if (name == "--config") config_path = value;
    if (name == "--listen") overrides.listen = value;
    if (name == "--metrics") overrides.metrics = value;
    if (name == "--kvdir") overrides.kvdir = value;
    if (name == "--http") overrides.http = value;
  }
  if (config_path.empty()) {
    std::cerr << "lazyattn-router: --config is required\n" << kUsage;
    return 2;
  }

  lazyattn::YamlConfig config;
  if (absl::Status s = config.LoadFile(config_path); !s.ok()) {
    std::cerr << "lazyattn-router: " << s.message() << "\n";
    return 2;
  }
  auto options = lazyattn::router::RouterOptionsFromYaml(config, overrides);
  if (!options.ok()) {
    lazyattn::LogError("router").Msg(std::string(options.status().message()));
    return 2;
  }
  lazyattn::ConfigureLogging(options->log);

  // Server TLS carries the API keys; kvdir and the workers check the router's own certificate.
  if (absl::Status s = lazyattn::CheckTransportSecurity(
          "lazyattn-router", config_path, !options->server.tls.cert_file.empty(),
          options->insecure);
      !s.ok()) {
    lazyattn::LogError("router").Msg(std::string(s.message()));
    return 2;
  }
  // Calls to kvdir and the workers carry the prompts the server's TLS protected.
  if (absl::Status s =
          lazyattn::CheckPeerCallSecurity(config_path, "client_tls.ca_file", /*calls_peers=*/true,
                                          !options->client_tls.ca_file.empty(), options->insecure);
      !s.ok()) {
    lazyattn::LogError("router").Msg(std::string(s.message()));
    return 2;
  }
  if (!options->insecure && options->auth.api_keys_file.empty()) {
    lazyattn::LogError("router").Msg(
        config_path + ": auth.api_keys_file: required (tools/gen-certs makes one), or insecure: true");
    return 2;
  }

  // Signals go to sigwait below, not to whichever gRPC thread happens to run.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGHUP);  // a closed terminal: the same clean shutdown
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);

  auto registry = std::make_shared<prometheus::Registry>();
  auto endpoint = lazyattn::StartMetricsEndpoint(
      options->metrics_address, options->metrics_bearer_token_file, registry);
  if (!endpoint.ok()) {
    lazyattn::LogError("router").Msg(std::string(endpoint.status().message()));
    // An unreadable token file is a configuration error (2); a port that cannot be bound, 1.
    return lazyattn::ExitStatusForStartFailure(endpoint.status());
  }
  std::unique_ptr<lazyattn::MetricsEndpoint> metrics = std::move(*endpoint);
  auto server = lazyattn::router::RouterServer::Create(*options, registry);
  if (!server.ok()) {
    lazyattn::LogError("router").Msg(std::string(server.status().message()));
    return lazyattn::ExitStatusForStartFailure(server.status());
  }
  if (metrics != nullptr) {
    std::cout << "lazyattn-router metrics on http://" << HostOf(options->metrics_address) << ":"
              << metrics->port() << "/metrics\n";
  }
  std::unique_ptr<lazyattn::router::HttpServer> http;
  if (!options->http.listen.empty()) {
    // The same routing, limits and API keys as the gRPC listener; TLS with its certificate.
    auto started = lazyattn::router::HttpServer::Create(
        options->http, options->server.tls, &(*server)->context(), (*server)->auth_processor());
    if (!started.ok()) {
      lazyattn::LogError("router").Msg(std::string(started.status().message()));
      return 1;
    }
    http = std::move(*started);
    std::cout << "lazyattn-router http on " << (http->tls() ? "https://" : "http://")
              << HostOf(options->http.listen) << ":" << http->port() << "\n";
  }
  std::cout << "lazyattn-router listening on " << HostOf(options->server.listen_address) << ":"
            << (*server)->port() << std::endl;

  int signal = 0;
  sigwait(&signals, &signal);
  lazyattn::LogInfo("router")
      .Str("signal", strsignal(signal))
      .Msg("shutting down");
  // Both listeners drain at once with the same grace; the HTTP server returns only when no HTTP
  // call is alive, so the RouterContext (destroyed with the server below) is no longer used.
  constexpr absl::Duration kDrainGrace = absl::Seconds(5);
  std::thread http_drain;
  if (http != nullptr) {
    http_drain = std::thread([&http, kDrainGrace] { http->Shutdown(kDrainGrace); });
  }
  (*server)->Shutdown(kDrainGrace);
  if (http_drain.joinable()) http_drain.join();
  http.reset();
  server->reset();
  metrics.reset();
  return 0;
}
