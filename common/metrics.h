// One Prometheus registry per process, exposed over HTTP at /metrics. Metric families are built
// once by each service's metrics class; labelled children are cached there, never created per
// request.
//
// The endpoint is prometheus-cpp's own exposer (civetweb inside) on a listener of its own. Beside
// the service's registry it serves, in every process:
//   lazyattn_build_info{version,git_sha,cuda} 1        what binary this is
//   process_cpu_seconds_total, process_resident_memory_bytes, process_virtual_memory_bytes,
//   process_open_fds, process_max_fds, process_start_time_seconds   (read from /proc/self)
//
// Two facts of the exposer that this class works around, both tested in metrics_test:
// - civetweb gives every worker thread a fixed 100 KiB stack; glibc carves static TLS out of that
//   stack, so a process with large static TLS (the worker links cuBLASLt: 94 KiB) cannot start
//   the threads. common/thread_stack.cc raises small stack requests (see there).
// - a civetweb thread serves one connection at a time and waits for an idle one's request up to
//   request_timeout_ms; the endpoint runs kThreads threads and a short timeout so that a few idle
//   connections (port scanners, stuck scrapers) never delay a scrape.
#ifndef LAZYATTN_COMMON_METRICS_H_
#define LAZYATTN_COMMON_METRICS_H_

#include <memory>
#include <string>

#include <prometheus/collectable.h>
#include <prometheus/registry.h>

#include "absl/status/statusor.h"

namespace prometheus {
class Exposer;
}

namespace lazyattn {

struct MetricsEndpointOptions {
  // Non-empty: every request must carry "Authorization: Bearer <token>" (Prometheus scrape config
  // `authorization: {credentials_file: ...}`); others get 401. Empty: open.
  std::string bearer_token;
};

class MetricsEndpoint {
 public:
  static constexpr int kThreads = 16;
  static constexpr int kRequestTimeoutMs = 3000;

  // Serves `registry` at http://address/metrics; address "127.0.0.1:0" picks a free port.
  // InvalidArgument naming the address when it is not HOST:PORT with a port of 0-65535
  // (CheckAddressPort); Unavailable naming it when it does not resolve or cannot bind.
  static absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Start(
      const std::string& address, std::shared_ptr<prometheus::Registry> registry,
      const MetricsEndpointOptions& options = {});
  ~MetricsEndpoint();  // stops serving; returns once the exposer's threads are gone
  MetricsEndpoint(const MetricsEndpoint&) = delete;
  MetricsEndpoint& operator=(const MetricsEndpoint&) = delete;

  int port() const { return port_; }

 private:
  MetricsEndpoint() = default;

  std::shared_ptr<prometheus::Registry> registry_;
  std::shared_ptr<prometheus::Collectable> process_;
  std::shared_ptr<prometheus::Registry> build_info_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  int port_ = 0;
  std::string wake_host_;  // where the destructor connects to wake civetweb's accept loop
};

// The endpoint a process's `metrics.listen` / `metrics.bearer_token_file` keys ask for, started
// the same way by the router, the worker and kvdir: null (no endpoint) when `address` is empty;
// else Start() on `address`, requiring the token read from `bearer_token_file` when that is
// non-empty. InvalidArgument naming metrics.bearer_token_file when the token cannot be read
// (nothing is started then); Start()'s errors for the address.
absl::StatusOr<std::unique_ptr<MetricsEndpoint>> StartMetricsEndpoint(
    const std::string& address, const std::string& bearer_token_file,
    std::shared_ptr<prometheus::Registry> registry);

// The token in `path` (surrounding whitespace dropped), for metrics.bearer_token_file.
// InvalidArgument naming `key` and the path when it cannot be read or is empty.
absl::StatusOr<std::string> ReadBearerTokenFile(const std::string& key, const std::string& path);

}  // namespace lazyattn

#endif  // LAZYATTN_COMMON_METRICS_H_
