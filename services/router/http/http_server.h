// The router's OpenAI-compatible HTTP listener (docs/http-api.md), on cpp-httplib:
//   POST /v1/chat/completions, POST /v1/completions   (stream: server-sent events)
//   GET  /v1/models                                   the served model
//   GET  /health                                      200 while a live worker is known, else 503;
//                                                     503 once the router drains
// Requests run on the router's own routing path in-process (HttpCall, a ForwardingCall), so
// routing, failover, limits and metrics are the gRPC API's. API keys: `Authorization: Bearer`
// checked by the gRPC listener's ApiKeyAuthorizer (same keys, scopes, rate limits, in-flight caps
// and metrics; /health is open like gRPC health). TLS with the router's server certificate when
// configured, re-read when its files change (every server.tls.refresh_interval_s, as the gRPC
// listeners do; certificate_reloader.h). Errors are OpenAI's JSON error objects (error_mapping.h).
//
// Limits: body size (413 at once for a Content-Length over it; a chunked body is counted and cut
// off at it), the body's framing (body_framing.h), the library's fixed 8 KiB header line and URI
// limits, a total deadline for each request's headers and the TLS handshake (header_timeout) and
// one for its body (body_timeout, 408), read and write timeouts for slow clients, connections per
// client address, `threads` connections served at once, `max_queued_connections` waiting, further
// connections answered 503 at once.
// Connections run in the router's own loop over cpp-httplib's request handling (guarded_server.h).
#ifndef LAZYATTN_SERVICES_ROUTER_HTTP_HTTP_SERVER_H_
#define LAZYATTN_SERVICES_ROUTER_HTTP_HTTP_SERVER_H_

#include <grpcpp/security/auth_metadata_processor.h>

#include <atomic>
#include <memory>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/grpc_util.h"
#include "services/router/http/certificate_reloader.h"
#include "services/router/http/client_slots.h"
#include "services/router/http/http_call.h"
#include "services/router/http/http_options.h"
#include "services/router/server/router_context.h"

namespace httplib {
class Server;
}

namespace lazyattn::router {

class HttpServer {
 public:
  // Binds options.listen and starts serving. `tls`: the router's server certificate and key
  // (empty: plaintext; a CA file is not used: HTTP clients authenticate with API keys).
  // `auth`: the gRPC listener's API key processor, or null when the router has no API keys.
  // `router` must outlive the server. Unavailable when the address cannot be bound;
  // InvalidArgument when the certificate or key cannot be loaded at start (later a pair that
  // cannot be loaded is logged and the previous one kept).
  static absl::StatusOr<std::unique_ptr<HttpServer>> Create(
      const HttpOptions& options, const TlsOptions& tls, RouterContext* router,
      std::shared_ptr<grpc::AuthMetadataProcessor> auth);
  ~HttpServer();

  int port() const { return port_; }
  bool tls() const { return tls_; }
  // Refuses new requests (503), lets requests in flight (streams included) run for up to `grace`
  // (the gRPC listener's drain grace), then stops listening and cancels those left (503, or an
  // error event on a stream), joins the connection threads and waits until no HttpCall is alive:
  // after it returns nothing of the HTTP API touches the RouterContext. Idempotent.
  void Shutdown(absl::Duration grace = absl::ZeroDuration());
  // HTTP calls alive now (tests).
  int live_calls() const { return live_->count(); }
  // Connections a thread serves now (tests).
  int open_connections() const { return slots_->open_total(); }

 private:
  HttpServer() = default;

  // Set by Shutdown when the grace is over; calls waiting on workers notice it within 250 ms and
  // end with 503.
  std::shared_ptr<std::atomic<bool>> stopping_ = std::make_shared<std::atomic<bool>>(false);
  std::shared_ptr<LiveCalls> live_ = std::make_shared<LiveCalls>();
  // Set when Shutdown begins: new completion and model requests get 503.
  std::shared_ptr<std::atomic<bool>> draining_ = std::make_shared<std::atomic<bool>>(false);
  // Declared before server_: the handshakes that read it end before it goes.
  std::unique_ptr<CertificateReloader> reloader_;
  // Declared before server_: its connection threads hold slots until they end.
  std::unique_ptr<ClientSlots> slots_;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
  bool tls_ = false;
};

}  // namespace lazyattn::router

#endif  // LAZYATTN_SERVICES_ROUTER_HTTP_HTTP_SERVER_H_
