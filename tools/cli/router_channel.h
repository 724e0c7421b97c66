// How the CLI reaches a secured router: server-side TLS (the cluster's CA) and an API key sent as
// `authorization: Bearer <key>` on every call (api_key_auth.h on the router). Flags, with
// environment fallbacks so scripts run under tools/cluster need none:
//   --ca FILE        PEM of the CA that signed the router's certificate   (LAZYATTN_CA)
//   --api-key KEY    the API key                                           (LAZYATTN_API_KEY)
//   --api-key-file F a file holding the key (keeps it out of `ps`)         (LAZYATTN_API_KEY_FILE)
// Without a CA the channel is plaintext (a router started with `insecure: true`).
#ifndef LAZYATTN_TOOLS_CLI_ROUTER_CHANNEL_H_
#define LAZYATTN_TOOLS_CLI_ROUTER_CHANNEL_H_

#include <memory>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "tools/cli/cli_args.h"

namespace lazyattn {

void DeclareRouterSecurityFlags(CliArgs& args);

// InvalidArgument naming the flag for an unreadable CA or key file, or a key without a CA (it
// would travel in plaintext).
absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeRouterChannel(const CliArgs& args,
                                                                 const std::string& address);

}  // namespace lazyattn

#endif  // LAZYATTN_TOOLS_CLI_ROUTER_CHANNEL_H_
