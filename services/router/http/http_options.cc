#include "services/router/http/http_options.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/grpc_util.h"
#include "common/status_macros.h"

namespace lazyattn::router {
namespace {

absl::StatusOr<absl::Duration> MillisIn(const YamlConfig& config, const std::string& key,
                                        absl::Duration fallback, int64_t lo, int64_t hi) {
  ASSIGN_OR_RETURN(const int64_t ms,
                   config.IntIn(key, absl::ToInt64Milliseconds(fallback), lo, hi));
  return absl::Milliseconds(ms);
}

}  // namespace

int EffectiveMaxConnectionsPerClient(const HttpOptions& options) {
  if (options.max_connections_per_client >= 0) return options.max_connections_per_client;
  return std::max(1, options.threads / 2);
}

absl::StatusOr<HttpOptions> HttpOptionsFromYaml(const YamlConfig& config) {
  HttpOptions o;
  ASSIGN_OR_RETURN(o.listen, config.String("http.listen", ""));
  if (!o.listen.empty()) {
    const size_t colon = o.listen.rfind(':');
    if (colon == std::string::npos || colon == 0 || colon + 1 == o.listen.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          config.source(), ": http.listen: expected host:port, got \"", o.listen, "\""));
    }
    // The HTTP library would bind port 99999 as 34463 (the port modulo 65536).
    if (absl::Status s = CheckAddressPort(o.listen, /*listening=*/true); !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(config.source(), ": http.listen: ", s.message()));
    }
  }
  ASSIGN_OR_RETURN(o.max_body_bytes,
                   config.IntIn("http.max_body_bytes", o.max_body_bytes, 1024, int64_t{1} << 32));
  ASSIGN_OR_RETURN(const int64_t threads, config.IntIn("http.threads", o.threads, 1, 4096));
  o.threads = static_cast<int>(threads);
  ASSIGN_OR_RETURN(const int64_t queued, config.IntIn("http.max_queued_connections",
                                                      o.max_queued_connections, 0, 1000000));
  o.max_queued_connections = static_cast<int>(queued);
  ASSIGN_OR_RETURN(o.read_timeout,
                   MillisIn(config, "http.read_timeout_ms", o.read_timeout, 1, 3600000));
  ASSIGN_OR_RETURN(o.write_timeout,
                   MillisIn(config, "http.write_timeout_ms", o.write_timeout, 1, 3600000));
  ASSIGN_OR_RETURN(o.write_wait_budget,
                   MillisIn(config, "http.write_wait_budget_ms", o.write_wait_budget, 0, 86400000));
  if (o.write_wait_budget > absl::ZeroDuration() && o.write_wait_budget < absl::Seconds(1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        config.source(), ": http.write_wait_budget_ms: must be 0 (off) or at least 1000, got ",
        absl::ToInt64Milliseconds(o.write_wait_budget)));
  }
  ASSIGN_OR_RETURN(
      o.min_send_bytes_per_s,
      config.IntIn("http.min_send_bytes_per_s", o.min_send_bytes_per_s, 0, int64_t{1} << 40));
  ASSIGN_OR_RETURN(o.header_timeout,
                   MillisIn(config, "http.header_timeout_ms", o.header_timeout, 1, 3600000));
  ASSIGN_OR_RETURN(o.max_header_bytes, config.IntIn("http.max_header_bytes", o.max_header_bytes,
                                                    4096, int64_t{16} << 20));
  ASSIGN_OR_RETURN(o.body_timeout,
                   MillisIn(config, "http.body_timeout_ms", o.body_timeout, 1, 3600000));
  ASSIGN_OR_RETURN(
      const int64_t per_client,
      config.IntIn("http.max_connections_per_client", o.max_connections_per_client, -1, 1000000));
  o.max_connections_per_client = static_cast<int>(per_client);
  ASSIGN_OR_RETURN(o.keep_alive_timeout, MillisIn(config, "http.keep_alive_timeout_ms",
                                                  o.keep_alive_timeout, 1000, 3600000));
  ASSIGN_OR_RETURN(const int64_t keep_alive,
                   config.IntIn("http.keep_alive_max_count", o.keep_alive_max_count, 1, 1000000));
  o.keep_alive_max_count = static_cast<int>(keep_alive);
  ASSIGN_OR_RETURN(o.request_timeout,
                   MillisIn(config, "http.request_timeout_ms", o.request_timeout, 1, 86400000));
  ASSIGN_OR_RETURN(o.max_logprob_entries, config.IntIn("http.max_logprob_entries",
                                                       o.max_logprob_entries, 1, int64_t{1} << 30));
  return o;
}

}  // namespace lazyattn::router
