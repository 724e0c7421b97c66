#include "services/router/server/router_config.h"

#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/grpc_util.h"
#include "common/status_macros.h"

namespace lazyattn::router {
namespace {

absl::Status OutOfRange(const YamlConfig& config, const std::string& key, const std::string& lo,
                        const std::string& hi, const std::string& value) {
  return absl::InvalidArgumentError(
      absl::StrCat(config.source(), ": ", key, ": must be in [", lo, ", ", hi, "], got ", value));
}

absl::StatusOr<double> DoubleIn(const YamlConfig& config, const std::string& key, double fallback,
                                double lo, double hi) {
  ASSIGN_OR_RETURN(double v, config.Double(key, fallback));
  if (!(v >= lo && v <= hi)) {
    return OutOfRange(config, key, absl::StrCat(lo), absl::StrCat(hi), absl::StrCat(v));
  }
  return v;
}

absl::StatusOr<absl::Duration> MillisIn(const YamlConfig& config, const std::string& key,
                                        absl::Duration fallback, int64_t lo, int64_t hi) {
  ASSIGN_OR_RETURN(int64_t ms, config.IntIn(key, absl::ToInt64Milliseconds(fallback), lo, hi));
  return absl::Milliseconds(ms);
}

// `listening`: an address this router listens on (port 0 lets the OS pick) rather than dials.
absl::Status CheckAddress(const YamlConfig& config, const std::string& key,
                          const std::string& address, bool may_be_empty, bool listening = false) {
  if (address.empty()) {
    if (may_be_empty) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat(config.source(), ": ", key, ": must not be empty"));
  }
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == address.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(config.source(), ": ", key, ": expected host:port, got \"", address, "\""));
  }
  if (absl::Status s = CheckAddressPort(address, listening); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(config.source(), ": ", key, ": ", s.message()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<RouterOptions> RouterOptionsFromYaml(const YamlConfig& config,
                                                    const FlagOverrides& overrides) {
  RouterOptions o;
  constexpr int64_t kMaxInt = std::numeric_limits<int32_t>::max();

  // server
  ASSIGN_OR_RETURN(o.server.listen_address, config.String("server.listen", "127.0.0.1:7000"));
  if (overrides.listen.has_value()) o.server.listen_address = *overrides.listen;
  RETURN_IF_ERROR(CheckAddress(config, "server.listen", o.server.listen_address, false, true));
  ASSIGN_OR_RETURN(o.server.tls.cert_file, config.String("server.tls.cert_file", ""));
  ASSIGN_OR_RETURN(o.server.tls.key_file, config.String("server.tls.key_file", ""));
  ASSIGN_OR_RETURN(o.server.tls.ca_file, config.String("server.tls.ca_file", ""));
  if (o.server.tls.cert_file.empty() != o.server.tls.key_file.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(config.source(), ": server.tls: cert_file and key_file must be set together"));
  }
  if (!o.server.tls.ca_file.empty() && o.server.tls.cert_file.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        config.source(), ": server.tls.ca_file: needs cert_file and key_file (server TLS)"));
  }
  ASSIGN_OR_RETURN(const int64_t tls_refresh_s,
                   config.IntIn("server.tls.refresh_interval_s", 60, 1, 86400));
  o.server.tls.refresh_interval_s = static_cast<int>(tls_refresh_s);
  ASSIGN_OR_RETURN(o.server.reflection, config.Bool("server.reflection", false));
  ASSIGN_OR_RETURN(o.metrics_address, config.String("metrics.listen", "127.0.0.1:9000"));
  if (overrides.metrics.has_value()) o.metrics_address = *overrides.metrics;
  RETURN_IF_ERROR(CheckAddress(config, "metrics.listen", o.metrics_address, true, true));
  ASSIGN_OR_RETURN(o.metrics_bearer_token_file, config.String("metrics.bearer_token_file", ""));
  ASSIGN_OR_RETURN(o.log, ReadLogOptions(config));

  // kvdir
  ASSIGN_OR_RETURN(o.kvdir.address, config.String("kvdir.address", ""));
  if (overrides.kvdir.has_value()) o.kvdir.address = *overrides.kvdir;
  RETURN_IF_ERROR(CheckAddress(config, "kvdir.address", o.kvdir.address, true));
  ASSIGN_OR_RETURN(o.kvdir.lookup_timeout,
                   MillisIn(config, "kvdir.lookup_timeout_ms", o.kvdir.lookup_timeout, 1, 10000));
  ASSIGN_OR_RETURN(const int64_t failures_to_skip,
                   config.IntIn("kvdir.lookup_failures_to_skip",
                                o.kvdir.lookup_gate.failures_to_skip, 0, 1000000));
  o.kvdir.lookup_gate.failures_to_skip = static_cast<int>(failures_to_skip);
  ASSIGN_OR_RETURN(
      o.kvdir.lookup_gate.base_backoff,
      MillisIn(config, "kvdir.lookup_backoff_ms", o.kvdir.lookup_gate.base_backoff, 1, 3600000));
  ASSIGN_OR_RETURN(
      o.kvdir.lookup_gate.max_backoff,
      MillisIn(config, "kvdir.lookup_max_backoff_ms", o.kvdir.lookup_gate.max_backoff, 1, 3600000));
  if (o.kvdir.lookup_gate.max_backoff < o.kvdir.lookup_gate.base_backoff) {
    return absl::InvalidArgumentError(
        "kvdir.lookup_max_backoff_ms: must be at least kvdir.lookup_backoff_ms");
  }
  ASSIGN_OR_RETURN(o.kvdir.refresh_interval, MillisIn(config, "kvdir.refresh_interval_ms",
                                                      o.kvdir.refresh_interval, 10, 600000));
  ASSIGN_OR_RETURN(o.kvdir.list_timeout,
                   MillisIn(config, "kvdir.list_timeout_ms", o.kvdir.list_timeout, 1, 60000));
  ASSIGN_OR_RETURN(o.kvdir.forget_after,
                   MillisIn(config, "kvdir.forget_after_ms", o.kvdir.forget_after, 100, 3600000));
  ASSIGN_OR_RETURN(const std::string loopback, config.String("kvdir.loopback_workers", "auto"));
  if (loopback == "auto") {
    o.kvdir.loopback_workers = KvdirOptions::LoopbackWorkers::kAuto;
  } else if (loopback == "dial") {
    o.kvdir.loopback_workers = KvdirOptions::LoopbackWorkers::kDial;
  } else if (loopback == "skip") {
    o.kvdir.loopback_workers = KvdirOptions::LoopbackWorkers::kSkip;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(config.source(),
                                                   ": kvdir.loopback_workers: expected auto, dial "
                                                   "or skip, got \"",
                                                   loopback, "\""));
  }

  // static workers
  ASSIGN_OR_RETURN(o.workers, config.StringList("workers"));
  for (size_t i = 0; i < o.workers.size(); ++i) {
    RETURN_IF_ERROR(CheckAddress(config, absl::StrCat("workers[", i, "]"), o.workers[i], false));
  }
  if (o.kvdir.address.empty() && o.workers.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(config.source(),
                     ": kvdir.address: no directory and no static workers; set one of "
                     "kvdir.address or workers"));
  }

  // authentication
  ASSIGN_OR_RETURN(o.insecure, config.Bool("insecure", false));
  ASSIGN_OR_RETURN(o.auth.api_keys_file, config.String("auth.api_keys_file", ""));
  ASSIGN_OR_RETURN(o.auth.reload_interval, MillisIn(config, "auth.reload_interval_ms",
                                                    o.auth.reload_interval, 10, 3600000));
  if (!o.auth.api_keys_file.empty() && o.server.tls.cert_file.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        config.source(),
        ": auth.api_keys_file: needs server.tls (API keys must not travel in plaintext)"));
  }

  // client TLS (calls to kvdir and the workers)
  ASSIGN_OR_RETURN(o.client_tls.ca_file, config.String("client_tls.ca_file", ""));
  ASSIGN_OR_RETURN(o.client_tls.cert_file, config.String("client_tls.cert_file", ""));
  ASSIGN_OR_RETURN(o.client_tls.key_file, config.String("client_tls.key_file", ""));
  o.client_tls.refresh_interval_s = o.server.tls.refresh_interval_s;  // one watch interval
  if (o.client_tls.cert_file.empty() != o.client_tls.key_file.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(config.source(), ": client_tls: cert_file and key_file must be set together"));
  }
  if (!o.client_tls.cert_file.empty() && o.client_tls.ca_file.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(config.source(), ": client_tls.ca_file: required with a client certificate"));
  }

  // routing
  RoutingOptions& r = o.routing;
  ASSIGN_OR_RETURN(const std::string policy, config.String("routing.policy", "cache_aware"));
  auto kind = ParsePolicyKind(policy);
  if (!kind.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(config.source(), ": routing.policy: ", kind.status().message()));
  }
  r.policy.kind = *kind;
  ASSIGN_OR_RETURN(r.policy.queued_token_weight, DoubleIn(config, "routing.queued_token_weight",
                                                          r.policy.queued_token_weight, 0, 1000));
  ASSIGN_OR_RETURN(
      r.policy.running_request_tokens,
      config.IntIn("routing.running_request_tokens", r.policy.running_request_tokens, 0, 1 << 24));
  ASSIGN_OR_RETURN(r.policy.imbalance_ratio,
                   DoubleIn(config, "routing.imbalance_ratio", r.policy.imbalance_ratio, 1, 1e6));
  ASSIGN_OR_RETURN(r.policy.imbalance_min_tokens,
                   config.IntIn("routing.imbalance_min_tokens", r.policy.imbalance_min_tokens, 0,
                                int64_t{1} << 40));
  ASSIGN_OR_RETURN(r.speculative.ttl,
                   MillisIn(config, "routing.speculative_ttl_ms", r.speculative.ttl, 0, 600000));
  ASSIGN_OR_RETURN(r.speculative.max_keys, config.IntIn("routing.speculative_max_keys",
                                                        r.speculative.max_keys, 0, 100000000));
  ASSIGN_OR_RETURN(r.bytes_per_token,
                   DoubleIn(config, "routing.bytes_per_token", r.bytes_per_token, 0.1, 1000));
  ASSIGN_OR_RETURN(const int64_t attempts,
                   config.IntIn("routing.max_attempts", r.max_attempts, 1, 100));
  r.max_attempts = static_cast<int>(attempts);
  ASSIGN_OR_RETURN(r.retry_budget.percent, DoubleIn(config, "routing.retry_budget_percent",
                                                    r.retry_budget.percent, 0, 100));
  ASSIGN_OR_RETURN(const int64_t min_retries,
                   config.IntIn("routing.retry_budget_min", r.retry_budget.min_retries, 0, 100000));
  r.retry_budget.min_retries = static_cast<int>(min_retries);
  ASSIGN_OR_RETURN(const int64_t threshold, config.IntIn("circuit_breaker.failure_threshold",
                                                         r.breaker.failure_threshold, 1, 1000000));
  r.breaker.failure_threshold = static_cast<int>(threshold);
  ASSIGN_OR_RETURN(r.breaker.open_duration, MillisIn(config, "circuit_breaker.open_ms",
                                                     r.breaker.open_duration, 1, 3600000));
  ASSIGN_OR_RETURN(r.breaker.failure_rate_percent,
                   DoubleIn(config, "circuit_breaker.failure_rate_percent",
                            r.breaker.failure_rate_percent, 0, 100));
  ASSIGN_OR_RETURN(const int64_t rate_min,
                   config.IntIn("circuit_breaker.failure_rate_min_requests",
                                r.breaker.failure_rate_min_requests, 1, 1000000));
  r.breaker.failure_rate_min_requests = static_cast<int>(rate_min);
  ASSIGN_OR_RETURN(r.breaker.failure_rate_window,
                   MillisIn(config, "circuit_breaker.failure_rate_window_ms",
                            r.breaker.failure_rate_window, 10, 3600000));

  ASSIGN_OR_RETURN(r.first_token_timeout, MillisIn(config, "routing.first_token_timeout_ms",
                                                   r.first_token_timeout, 0, 3600000));
  ASSIGN_OR_RETURN(r.first_token_max_wait, MillisIn(config, "routing.first_token_max_wait_ms",
                                                    r.first_token_max_wait, 0, 86400000));
  if (r.first_token_max_wait > absl::ZeroDuration() &&
      r.first_token_max_wait < r.first_token_timeout) {
    return absl::InvalidArgumentError(absl::StrCat(
        config.source(),
        ": routing.first_token_max_wait_ms: ", absl::ToInt64Milliseconds(r.first_token_max_wait),
        " is below routing.first_token_timeout_ms (",
        absl::ToInt64Milliseconds(r.first_token_timeout), "); 0 turns the bound off"));
  }
  ASSIGN_OR_RETURN(r.token_idle_timeout, MillisIn(config, "routing.token_idle_timeout_ms",
                                                  r.token_idle_timeout, 0, 3600000));
  ASSIGN_OR_RETURN(r.prefetch_timeout,
                   MillisIn(config, "routing.prefetch_timeout_ms", r.prefetch_timeout, 0, 3600000));
  ASSIGN_OR_RETURN(r.client_write_timeout, MillisIn(config, "routing.client_write_timeout_ms",
                                                    r.client_write_timeout, 0, 3600000));
  ASSIGN_OR_RETURN(r.client_write_wait_budget,
                   MillisIn(config, "routing.client_write_wait_budget_ms",
                            r.client_write_wait_budget, 0, 86400000));
  // Shorter ones would cut healthy streams and count a worker's ordinary Prefetch as a failure.
  for (const auto& [key, value] :
       {std::pair{"routing.prefetch_timeout_ms", r.prefetch_timeout},
        std::pair{"routing.client_write_timeout_ms", r.client_write_timeout},
        std::pair{"routing.client_write_wait_budget_ms", r.client_write_wait_budget}}) {
    if (value > absl::ZeroDuration() && value < absl::Seconds(1)) {
      return absl::InvalidArgumentError(absl::StrCat(
          key, ": must be 0 (off) or at least 1000, got ", absl::ToInt64Milliseconds(value)));
    }
  }
  ASSIGN_OR_RETURN(
      const int64_t quarantine_s,
      config.IntIn("routing.quarantine_ttl_s", absl::ToInt64Seconds(r.quarantine.ttl), 0, 86400));
  r.quarantine.ttl = absl::Seconds(quarantine_s);
  ASSIGN_OR_RETURN(r.quarantine.max_entries, config.IntIn("routing.quarantine_max_entries",
                                                          r.quarantine.max_entries, 1, 10000000));

  // health probing and outlier ejection
  HealthCheckOptions& h = o.health;
  ASSIGN_OR_RETURN(h.interval, MillisIn(config, "health_check.interval_ms", h.interval, 0, 600000));
  if (h.interval > absl::ZeroDuration() && h.interval < absl::Milliseconds(10)) {
    return OutOfRange(config, "health_check.interval_ms", "10", "600000 (or 0: off)",
                      absl::StrCat(absl::ToInt64Milliseconds(h.interval)));
  }
  ASSIGN_OR_RETURN(h.timeout, MillisIn(config, "health_check.timeout_ms", h.timeout, 1, 60000));
  ASSIGN_OR_RETURN(const int64_t unhealthy, config.IntIn("health_check.unhealthy_threshold",
                                                         h.outliers.consecutive_failures, 1, 1000));
  h.outliers.consecutive_failures = static_cast<int>(unhealthy);
  ASSIGN_OR_RETURN(h.outliers.base_ejection, MillisIn(config, "health_check.base_ejection_ms",
                                                      h.outliers.base_ejection, 1, 3600000));
  ASSIGN_OR_RETURN(h.outliers.max_ejection, MillisIn(config, "health_check.max_ejection_ms",
                                                     h.outliers.max_ejection, 1, 86400000));
  if (h.outliers.max_ejection < h.outliers.base_ejection) {
    return absl::InvalidArgumentError(
        absl::StrCat(config.source(),
                     ": health_check.max_ejection_ms: must be >= health_check.base_ejection_ms (",
                     absl::ToInt64Milliseconds(h.outliers.base_ejection), "), got ",
                     absl::ToInt64Milliseconds(h.outliers.max_ejection)));
  }

  // limits
  ApiLimits& l = o.limits;
  ASSIGN_OR_RETURN(
      const int64_t message_bytes,
      config.IntIn("limits.max_message_bytes", o.server.max_message_bytes, 1024, kMaxInt));
  o.server.max_message_bytes = static_cast<int>(message_bytes);
  ASSIGN_OR_RETURN(const int64_t inflight, config.IntIn("limits.max_inflight_requests",
                                                        o.max_inflight_requests, 1, 1000000));
  o.max_inflight_requests = static_cast<int>(inflight);
  // The request limits: one parser and one validator with the workers (common/).
  ASSIGN_OR_RETURN(l, ApiLimitsFromYaml(config, l));

  // the OpenAI-compatible HTTP listener
  ASSIGN_OR_RETURN(o.http, HttpOptionsFromYaml(config));
  if (overrides.http.has_value()) o.http.listen = *overrides.http;
  if (overrides.http.has_value() && !o.http.listen.empty()) {
    if (o.http.listen.rfind(':') == std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("--http: expected host:port, got \"", o.http.listen, "\""));
    }
    if (absl::Status s = CheckAddressPort(o.http.listen, /*listening=*/true); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--http: ", s.message()));
    }
  }
  // The HTTPS listener asks for no client certificate, so without API keys it would serve anyone
  // even where the gRPC listener demands certificates (server.tls.ca_file).
  if (!o.http.listen.empty() && o.auth.api_keys_file.empty() && !o.insecure) {
    return absl::InvalidArgumentError(absl::StrCat(
        config.source(),
        ": http.listen: needs auth.api_keys_file (the HTTP API checks no client certificate), "
        "or insecure: true"));
  }

  RETURN_IF_ERROR(config.Finish());
  return o;
}

}  // namespace lazyattn::router
