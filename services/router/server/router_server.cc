#include "services/router/server/router_server.h"

#include <chrono>

#include "common/tls_files.h"
#include "services/router/server/api_key_auth.h"

namespace lazyattn::router {

absl::StatusOr<std::unique_ptr<RouterServer>> RouterServer::Create(
    const RouterOptions& options, std::shared_ptr<prometheus::Registry> registry) {
  // Every worker and kvdir channel dials with client_tls, most of them later: a file that cannot
  // serve would leave the router up and SERVING, every request failing for want of a worker.
  if (!options.client_tls.ca_file.empty()) {
    if (absl::Status s = CheckTlsFiles(options.client_tls, "client_tls."); !s.ok()) return s;
  }
  std::unique_ptr<RouterServer> server(new RouterServer());
  server->registry_ =
      registry != nullptr ? std::move(registry) : std::make_shared<prometheus::Registry>();
  server->context_ = std::make_unique<RouterContext>(options, *server->registry_);
  ServerOptions grpc_options = options.server;
  KeyLimiter* key_limiter = nullptr;
  if (!options.auth.api_keys_file.empty()) {
    auto auth = ApiKeyAuthorizer::Create(options.auth.api_keys_file, options.auth.reload_interval,
                                         *server->registry_);
    if (!auth.ok()) return auth.status();
    // The authorizer (and its limiter) lives as long as the server's credentials, past every
    // call's reactor.
    key_limiter = &(*auth)->limiter();
    grpc_options.auth_processor = std::move(*auth);
    server->auth_processor_ = grpc_options.auth_processor;
  }
  server->service_ = std::make_unique<InferenceService>(server->context_.get(), key_limiter);
  server->context_->RefreshWorkers();
  auto built = StartGrpcServer(grpc_options, {server->service_.get()});
  if (!built.ok()) return built.status();
  server->server_ = std::move(built->server);
  server->port_ = built->port;
  // Both sets of files passed their checks above: this only finds their mirrors.
  server->tls_metrics_ = std::make_unique<TlsExpiryMetrics>(*server->registry_);
  if (absl::Status s = server->tls_metrics_->Watch(kTlsRoleServer, options.server.tls); !s.ok()) {
    return s;
  }
  if (absl::Status s = server->tls_metrics_->Watch(kTlsRoleClient, options.client_tls); !s.ok()) {
    return s;
  }
  // Health by service name too (probes that name the API); the overall status, set NOT_SERVING
  // at shutdown, turns every name with it.
  if (auto* health = server->server_->GetHealthCheckService()) {
    health->SetServingStatus(lazyattn::v1::Inference::service_full_name(), true);
  }
  server->refresher_ = std::thread([s = server.get()] { s->RefreshLoop(); });
  return server;
}

RouterServer::~RouterServer() { Shutdown(); }

void RouterServer::RefreshLoop() {
  const absl::Duration interval = context_->options().kvdir.refresh_interval;
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    if (mu_.AwaitWithTimeout(absl::Condition(&stopping_), interval)) break;
    mu_.Unlock();
    context_->RefreshWorkers();
    mu_.Lock();
  }
}

void RouterServer::Shutdown(absl::Duration grace) {
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return;
    shut_down_ = true;
    stopping_ = true;
  }
  context_->MarkShuttingDown();
  if (server_ != nullptr) {
    server_->Shutdown(absl::ToChronoTime(absl::Now() + grace));
    server_->Wait();
  }
  if (refresher_.joinable()) refresher_.join();
}

}  // namespace lazyattn::router
