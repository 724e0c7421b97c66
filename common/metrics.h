// One Prometheus registry per process, exposed over HTTP at /metrics. Metric families are built
// once by each service's metrics class; labelled children are cached there, never created per
// request.
//
// The endpoint is a minimal HTTP/1.1 server on one thread of its own (GET /metrics, then the
// connection closes; anything else is 404), not prometheus-cpp's civetweb exposer: civetweb
// starts its threads with a fixed small stack, and a process that links libraries with large
// static TLS (the worker links cuBLASLt: 94 KB) cannot start them at all.
#ifndef LAZYATTN_COMMON_METRICS_H_
#define LAZYATTN_COMMON_METRICS_H_

#include <memory>
#include <string>
#include <thread>

#include <prometheus/registry.h>

#include "absl/status/statusor.h"

namespace lazyattn {

class MetricsEndpoint {
 public:
  // Serves `registry` at http://address/metrics; address "127.0.0.1:0" picks a free port.
  // Unavailable naming the address when it cannot bind.
  static absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Start(
      const std::string& address, std::shared_ptr<prometheus::Registry> registry);
  ~MetricsEndpoint();  // stops serving and joins the thread
  MetricsEndpoint(const MetricsEndpoint&) = delete;
  MetricsEndpoint& operator=(const MetricsEndpoint&) = delete;

  int port() const { return port_; }

 private:
  MetricsEndpoint() = default;
  void Serve();
  void Answer(int connection);

  std::shared_ptr<prometheus::Registry> registry_;
  int listen_fd_ = -1;
  int wake_fd_[2] = {-1, -1};  // written by the destructor to end Serve()
  int port_ = 0;
  std::thread thread_;
};

}  // namespace lazyattn

#endif  // LAZYATTN_COMMON_METRICS_H_
