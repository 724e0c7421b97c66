// `lazyattn health`: asks a kvdir, router or worker for its grpc.health.v1 status, for probes
// that have no gRPC health client (the docker compose health checks). Prints SERVING or
// NOT_SERVING; exit status 0 only for SERVING.
#include <cstdlib>
#include <iostream>

#include "common/grpc_util.h"
#include "tools/cli/cli_args.h"
#include "tools/cli/commands.h"

namespace lazyattn {

int HealthCommand(int argc, char** argv) {
  CliArgs args;
  args.Declare("addr", CliArgs::Kind::kValue, "the server's HOST:PORT (gRPC)");
  args.Declare("service", CliArgs::Kind::kValue,
               "a service name, e.g. lazyattn.v1.Inference (default: the whole server)");
  args.Declare("timeout-ms", CliArgs::Kind::kValue, "deadline of the check (default 2000)");
  args.Declare("ca", CliArgs::Kind::kValue,
               "CA certificate (PEM) of the server's TLS; default $LAZYATTN_CA; none: plaintext");
  args.Declare("help", CliArgs::Kind::kSwitch, "show this help");
  if (absl::Status s = args.Parse(argc, argv, 2); !s.ok()) {
    std::cerr << "lazyattn health: " << s.message() << "\n" << args.Help();
    return 2;
  }
  if (args.Has("help")) {
    std::cout << "lazyattn health flags:\n" << args.Help();
    return 0;
  }
  const auto timeout_ms = args.Int("timeout-ms", 2000);
  if (!args.Has("addr") || !timeout_ms.ok() || *timeout_ms <= 0) {
    std::cerr << "lazyattn health: --addr is required and --timeout-ms must be > 0\n"
              << args.Help();
    return 2;
  }
  // Health is open on every server: TLS (to trust the server) but no certificate or key.
  TlsOptions tls;
  tls.ca_file = args.Has("ca") ? args.String("ca") : "";
  if (const char* env = std::getenv("LAZYATTN_CA"); !args.Has("ca") && env != nullptr) {
    tls.ca_file = env;
  }
  auto channel = MakeChannel(args.String("addr"), tls);
  if (!channel.ok()) return CliFail(channel.status());
  auto serving =
      CheckGrpcHealth(*channel, args.String("service"), absl::Milliseconds(*timeout_ms));
  if (!serving.ok()) return CliFail(serving.status());
  std::cout << (*serving ? "SERVING" : "NOT_SERVING") << "\n";
  return *serving ? 0 : 1;
}

}  // namespace lazyattn
