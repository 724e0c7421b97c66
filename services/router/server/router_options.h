// Everything the router is configured with, grouped by concern (docs/router.md lists the YAML
// keys that fill it; router_config.h parses them).
#ifndef LAZYATTN_SERVICES_ROUTER_SERVER_ROUTER_OPTIONS_H_
#define LAZYATTN_SERVICES_ROUTER_SERVER_ROUTER_OPTIONS_H_

#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/grpc_util.h"
#include "services/router/policy/circuit_breaker.h"
#include "services/router/policy/routing_policy.h"
#include "services/router/policy/speculative_entries.h"
#include "common/request_validator.h"

namespace lazyattn::router {

struct KvdirOptions {
  std::string address;                                     // empty: no directory
  absl::Duration lookup_timeout = absl::Milliseconds(50);  // per request; then load-only
  absl::Duration refresh_interval = absl::Milliseconds(500);
  absl::Duration list_timeout = absl::Milliseconds(500);  // ListWorkers and Worker.Status polls
  absl::Duration forget_after = absl::Seconds(10);        // unlisted directory workers dropped
};

struct RoutingOptions {
  PolicyOptions policy;
  SpeculativeOptions speculative;
  CircuitBreakerOptions breaker;
  double bytes_per_token = 4.0;  // estimate of a text document's tokens for speculative hits
  int max_attempts = 3;          // workers tried per request (failover before the first token)
};

struct RouterOptions {
  ServerOptions server;         // listen address, message limits, server TLS
  std::string metrics_address;  // host:port of /metrics; empty: off (used by main)
  KvdirOptions kvdir;
  std::vector<std::string> workers;  // static worker addresses, used besides the directory's
  TlsOptions client_tls;             // for the router's calls to kvdir and the workers
  RoutingOptions routing;
  int max_inflight_requests = 256;  // beyond: RESOURCE_EXHAUSTED
  ApiLimits limits;  // the same validator and limits as the workers'
};

}  // namespace lazyattn::router

#endif  // LAZYATTN_SERVICES_ROUTER_SERVER_ROUTER_OPTIONS_H_
