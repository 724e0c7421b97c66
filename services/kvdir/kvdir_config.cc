#include "services/kvdir/kvdir_config.h"

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_macros.h"

namespace lazyattn::kvdir {
absl::StatusOr<KvdirOptions> KvdirOptionsFromYaml(const YamlConfig& config) {
  KvdirOptions o;
  ASSIGN_OR_RETURN(o.listen_address, config.String("server.listen", o.listen_address));
  if (o.listen_address.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(config.source(), ": server.listen: must not be empty"));
  }
  ASSIGN_OR_RETURN(o.tls.cert_file, config.String("server.tls.cert_file", ""));
  ASSIGN_OR_RETURN(o.tls.key_file, config.String("server.tls.key_file", ""));
  ASSIGN_OR_RETURN(o.tls.ca_file, config.String("server.tls.ca_file", ""));
  if (o.tls.cert_file.empty() != o.tls.key_file.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(config.source(), ": server.tls: cert_file and key_file must be set together"));
  }
  if (!o.tls.ca_file.empty() && o.tls.cert_file.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        config.source(), ": server.tls.ca_file: needs cert_file and key_file (server TLS)"));
  }
  ASSIGN_OR_RETURN(const int64_t tls_refresh_s,
                   config.IntIn("server.tls.refresh_interval_s", 60, 1, 86400));
  o.tls.refresh_interval_s = static_cast<int>(tls_refresh_s);
  ASSIGN_OR_RETURN(o.reflection, config.Bool("server.reflection", false));
  ASSIGN_OR_RETURN(o.insecure, config.Bool("insecure", false));
  ASSIGN_OR_RETURN(o.metrics_address, config.String("metrics.listen", o.metrics_address));
  ASSIGN_OR_RETURN(o.metrics_bearer_token_file, config.String("metrics.bearer_token_file", ""));
  ASSIGN_OR_RETURN(o.log, ReadLogOptions(config));
  ASSIGN_OR_RETURN(const int64_t max_keys, config.IntIn("limits.max_keys_per_lookup",
                                                        o.limits.max_keys_per_lookup, 1, 1 << 20));
  o.limits.max_keys_per_lookup = static_cast<int>(max_keys);
  ASSIGN_OR_RETURN(
      const int64_t max_bytes,
      config.IntIn("limits.max_message_bytes", o.limits.max_message_bytes, 4096, INT32_MAX));
  o.limits.max_message_bytes = static_cast<int>(max_bytes);
  ASSIGN_OR_RETURN(o.limits.max_workers,
                   config.IntIn("limits.max_workers", o.limits.max_workers, 1, 1 << 20));
  ASSIGN_OR_RETURN(o.limits.max_entries_per_worker,
                   config.IntIn("limits.max_entries_per_worker", o.limits.max_entries_per_worker, 1,
                                int64_t{1} << 30));
  ASSIGN_OR_RETURN(o.limits.max_entries,
                   config.IntIn("limits.max_entries", o.limits.max_entries, 1, int64_t{1} << 34));
  ASSIGN_OR_RETURN(const int64_t max_id, config.IntIn("limits.max_worker_id_length",
                                                      o.limits.max_worker_id_length, 1, 4096));
  o.limits.max_worker_id_length = static_cast<int>(max_id);
  ASSIGN_OR_RETURN(
      o.limits.max_publish_streams,
      config.IntIn("limits.max_publish_streams", o.limits.max_publish_streams, 1, 1 << 20));
  ASSIGN_OR_RETURN(const int64_t per_certificate,
                   config.IntIn("limits.max_streams_per_certificate",
                                o.limits.max_streams_per_certificate, 1, 1024));
  o.limits.max_streams_per_certificate = static_cast<int>(per_certificate);
  ASSIGN_OR_RETURN(
      o.limits.hello_timeout_ms,
      config.IntIn("limits.hello_timeout_ms", o.limits.hello_timeout_ms, 100, 600'000));
  if (config.Has("limits.max_publish_entries_per_s")) {  // absent: as max_entries_per_worker
    ASSIGN_OR_RETURN(o.limits.max_publish_entries_per_s,
                     config.IntIn("limits.max_publish_entries_per_s", 0, 0, int64_t{1} << 34));
  }
  ASSIGN_OR_RETURN(o.lease_ms, config.IntIn("lease_ms", o.lease_ms, 50, 3'600'000));
  RETURN_IF_ERROR(config.Finish());
  return o;
}

}  // namespace lazyattn::kvdir
