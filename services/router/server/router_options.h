// Everything the router is configured with, grouped by concern (docs/router.md lists the YAML
// keys that fill it; router_config.h parses them).
#ifndef LAZYATTN_SERVICES_ROUTER_SERVER_ROUTER_OPTIONS_H_
#define LAZYATTN_SERVICES_ROUTER_SERVER_ROUTER_OPTIONS_H_

#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/grpc_util.h"
#include "common/log.h"
#include "common/request_validator.h"
#include "services/router/http/http_options.h"
#include "services/router/policy/circuit_breaker.h"
#include "services/router/policy/lookup_gate.h"
#include "services/router/policy/outlier_detector.h"
#include "services/router/policy/query_quarantine.h"
#include "services/router/policy/routing_policy.h"
#include "services/router/policy/speculative_entries.h"
#include "services/router/server/retry_budget.h"

namespace lazyattn::router {

struct KvdirOptions {
  std::string address;                                     // empty: no directory
  absl::Duration lookup_timeout = absl::Milliseconds(50);  // per request; then load-only
  absl::Duration refresh_interval = absl::Milliseconds(500);
  absl::Duration list_timeout = absl::Milliseconds(500);  // ListWorkers and Worker.Status polls
  absl::Duration forget_after = absl::Seconds(10);        // unlisted directory workers dropped
  // Whether workers the directory lists at a loopback address are dialled (WorkerRegistry):
  // kAuto dials them when kvdir itself is reached on this host (DialsThisHost(address)).
  enum class LoopbackWorkers { kAuto, kDial, kSkip };
  LoopbackWorkers loopback_workers = LoopbackWorkers::kAuto;
  // After this many failed lookups in a row, requests route by load without one for a backoff
  // (LookupGate: a down directory must not cost every request lookup_timeout).
  LookupGateOptions lookup_gate;
};

// Active health probing of every known worker (grpc.health.v1 Check of the whole server).
struct HealthCheckOptions {
  absl::Duration interval = absl::Milliseconds(500);  // zero: no probing, nobody is ejected
  absl::Duration timeout = absl::Milliseconds(500);   // a probe not answered by then failed
  OutlierOptions outliers;                            // when failed probes eject, and for how long
};

struct RoutingOptions {
  PolicyOptions policy;
  SpeculativeOptions speculative;
  CircuitBreakerOptions breaker;
  double bytes_per_token = 4.0;  // estimate of a text document's tokens for speculative hits
  int max_attempts = 3;          // workers tried per request (failover before the first token)
  // Failover attempts in flight over all requests (retry_budget.h): at most
  // max(retry_budget.min_retries, retry_budget.percent % of the requests in flight).
  RetryBudgetOptions retry_budget;
  // An attempt with no token by then is cancelled and the request goes to the next worker (the
  // attempt counts against the worker's breaker). Zero: no limit. The default suits CPU workers
  // under load; GPU fleets set a few seconds (docs/router.md).
  absl::Duration first_token_timeout = absl::Seconds(30);
  // The most an attempt may go without its first token however many signs of life its worker
  // sends (PrefillProgress events restart first_token_timeout, not this): a worker that keeps
  // reporting its request queued, or its prompt growing, no longer holds a request without a
  // client deadline for ever. Cut like a first-token timeout. Zero: no limit; otherwise at least
  // first_token_timeout.
  absl::Duration first_token_max_wait = absl::Minutes(10);
  // Once the first token came: an attempt whose worker sends nothing for this long while the
  // router waits on it (not while the router waits on its client) is cancelled, counted against
  // the worker's breaker; a Complete call goes to the next worker, a stream ends UNAVAILABLE
  // (its tokens were sent). A worker frozen mid-generation no longer holds its requests until
  // their clients' deadlines, which may be none. Zero: no limit.
  absl::Duration token_idle_timeout = absl::Seconds(30);
  // A Prefetch call to one worker with no answer by then is cancelled, counted against the
  // worker's breaker, and the documents go to the next worker (a Prefetch sends no progress
  // events, so this bounds the whole call). Zero: only the client's deadline, which may be none.
  absl::Duration prefetch_timeout = absl::Seconds(120);
  // A streaming client that has not taken the router's last write for this long (it stopped
  // reading) has its call cancelled, releasing its admission slot and its worker's request
  // (client_write_watch.h). Zero: only the client's deadline, which may be none.
  absl::Duration client_write_timeout = absl::Seconds(30);
  // A call whose writes have waited on its client for this long in all is cancelled too: a
  // client that takes one message just before each client_write_timeout would otherwise keep
  // its slot for as long as it likes. Zero: no such limit.
  absl::Duration client_write_wait_budget = absl::Seconds(120);
  // Query-of-death containment: a request content that lost two workers' connections mid-call
  // is refused for quarantine.ttl (routing.quarantine_ttl_s; zero: off).
  QuarantineOptions quarantine;
};

struct AuthOptions {
  // The API key file (api_key_auth.h); empty: no API keys (main requires `insecure: true` then).
  std::string api_keys_file;
  absl::Duration reload_interval = absl::Seconds(1);  // how often the file's mtime is checked
};

struct RouterOptions {
  ServerOptions server;         // listen address, message limits, server TLS
  std::string metrics_address;  // host:port of /metrics; empty: off (used by main)
  // Non-empty: /metrics requires "Authorization: Bearer <the file's token>" (used by main).
  std::string metrics_bearer_token_file;
  LogOptions log;  // log.level, log.format (applied by main)
  KvdirOptions kvdir;
  std::vector<std::string> workers;  // static worker addresses, used besides the directory's
  TlsOptions client_tls;             // for the router's calls to kvdir and the workers
  RoutingOptions routing;
  HealthCheckOptions health;
  int max_inflight_requests = 256;  // beyond: RESOURCE_EXHAUSTED
  ApiLimits limits;  // the same validator and limits as the workers'
  AuthOptions auth;
  HttpOptions http;  // the OpenAI-compatible HTTP listener (off unless http.listen is set)
  // Plaintext without API keys, accepted by main only when the config says so (common/auth.h).
  bool insecure = false;
};

}  // namespace lazyattn::router

#endif  // LAZYATTN_SERVICES_ROUTER_SERVER_ROUTER_OPTIONS_H_
