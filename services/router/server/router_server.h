// The router process's server: the Inference service on a gRPC server (health + reflection via
// StartGrpcServer) plus the background refresh of the worker list.
//
//   ASSIGN_OR_RETURN(auto server, RouterServer::Create(options, registry));
//   ... server->port() ...
//   server->Shutdown();  // also done by the destructor
#ifndef LAZYATTN_SERVICES_ROUTER_SERVER_ROUTER_SERVER_H_
#define LAZYATTN_SERVICES_ROUTER_SERVER_ROUTER_SERVER_H_

#include <grpcpp/grpcpp.h>
#include <prometheus/registry.h>

#include <memory>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/tls_expiry_metrics.h"
#include "services/router/server/inference_service.h"
#include "services/router/server/router_context.h"
#include "services/router/server/router_options.h"

namespace lazyattn::router {

class RouterServer {
 public:
  // Refreshes the worker list once (bounded by kvdir.list_timeout per source; a directory that is
  // down is not an error), starts serving, and refreshes every kvdir.refresh_interval after.
  // Unavailable when the listen address cannot be bound; InvalidArgument for unreadable TLS files.
  static absl::StatusOr<std::unique_ptr<RouterServer>> Create(
      const RouterOptions& options, std::shared_ptr<prometheus::Registry> registry);
  ~RouterServer();

  int port() const { return port_; }
  // Refresh the worker list now (tests; the background thread does it periodically).
  void RefreshWorkersNow() { context_->RefreshWorkers(); }
  // Stops accepting calls, cancels those still running after `grace`, stops the refresher.
  void Shutdown(absl::Duration grace = absl::Seconds(5));

  RouterContext& context() { return *context_; }
  // The API key processor of the gRPC listener (null without API keys), for the HTTP listener.
  std::shared_ptr<grpc::AuthMetadataProcessor> auth_processor() const { return auth_processor_; }

 private:
  RouterServer() = default;
  void RefreshLoop();

  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<TlsExpiryMetrics> tls_metrics_;  // server.tls and client_tls
  std::unique_ptr<RouterContext> context_;
  std::shared_ptr<grpc::AuthMetadataProcessor> auth_processor_;
  std::unique_ptr<InferenceService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::thread refresher_;

  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace lazyattn::router

#endif  // LAZYATTN_SERVICES_ROUTER_SERVER_ROUTER_SERVER_H_
