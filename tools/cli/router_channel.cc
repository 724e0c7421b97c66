#include "tools/cli/router_channel.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/grpc_util.h"

namespace lazyattn {
namespace {

std::string FlagOrEnv(const CliArgs& args, const char* flag, const char* env) {
  if (args.Has(flag)) return args.String(flag);
  const char* v = std::getenv(env);
  return v == nullptr ? "" : v;
}

}  // namespace

void DeclareRouterSecurityFlags(CliArgs& args) {
  args.Declare("ca", CliArgs::Kind::kValue,
               "CA certificate (PEM) of the router's TLS; default $LAZYATTN_CA; none: plaintext");
  args.Declare("api-key", CliArgs::Kind::kValue, "API key; default $LAZYATTN_API_KEY");
  args.Declare("api-key-file", CliArgs::Kind::kValue,
               "file holding the API key; default $LAZYATTN_API_KEY_FILE");
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeRouterChannel(const CliArgs& args,
                                                                 const std::string& address) {
  TlsOptions tls;
  tls.ca_file = FlagOrEnv(args, "ca", "LAZYATTN_CA");
  std::string key = FlagOrEnv(args, "api-key", "LAZYATTN_API_KEY");
  if (key.empty()) {
    const std::string key_file = FlagOrEnv(args, "api-key-file", "LAZYATTN_API_KEY_FILE");
    if (!key_file.empty()) {
      std::ifstream in(key_file);
      std::stringstream ss;
      ss << in.rdbuf();
      if (!in) return absl::InvalidArgumentError(absl::StrCat("--api-key-file: cannot read ", key_file));
      key = std::string(absl::StripAsciiWhitespace(ss.str()));
    }
  }
  if (key.empty()) return MakeChannel(address, tls);
  if (tls.ca_file.empty()) {
    return absl::InvalidArgumentError(
        "--api-key: needs --ca (or LAZYATTN_CA): an API key is sent only over TLS");
  }
  return MakeChannel(address, tls, 64 << 20, grpc::AccessTokenCredentials(key));
}

}  // namespace lazyattn
