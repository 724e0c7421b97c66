// One Prometheus registry per process, exposed over HTTP at /metrics (prometheus-cpp pull).
// Metric families are built once by each service's metrics class; labelled children are cached
// there, never created per request.
#ifndef LAZYATTN_COMMON_METRICS_H_
#define LAZYATTN_COMMON_METRICS_H_

#include <memory>
#include <string>

#include <prometheus/exposer.h>
#include <prometheus/registry.h>

#include "absl/status/statusor.h"

namespace lazyattn {

class MetricsEndpoint {
 public:
  // Serves `registry` at http://address/metrics; address "127.0.0.1:0" picks a free port.
  // Unavailable naming the address when it cannot bind.
  static absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Start(
      const std::string& address, std::shared_ptr<prometheus::Registry> registry);
  int port() const;

 private:
  std::unique_ptr<prometheus::Exposer> exposer_;
};

}  // namespace lazyattn

#endif  // LAZYATTN_COMMON_METRICS_H_
