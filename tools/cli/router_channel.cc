#include "tools/cli/router_channel.h"

#include <cstdint>
#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/file_stamp.h"
#include "common/grpc_util.h"

namespace lazyattn {
namespace {

constexpr int64_t kMaxApiKeyFileBytes = 64 << 10;

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
      // A regular file of at most 64 KiB (an API key is tens of bytes): /dev/zero was read until
      // memory ran out, and a directory or an empty file sent the request with no key at all.
      absl::StatusOr<StampedText> text = ReadStampedFile(key_file, kMaxApiKeyFileBytes);
      if (!text.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--api-key-file: ", text.status().message()));
      }
      key = std::string(absl::StripAsciiWhitespace(text->text));
      if (key.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--api-key-file: ", key_file, " holds no key"));
      }
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
