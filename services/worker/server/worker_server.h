// The lazyattn-worker server: the engine, the Worker gRPC service, the kvdir publisher (optional)
// and the /metrics endpoint, with one shutdown path.
//
//   WorkerServerOptions options;
//   options.grpc.listen_address = "127.0.0.1:0";
//   ASSIGN_OR_RETURN(auto server, WorkerServer::Create(options, weights, tokenizer));
//   ... server->address() ...
//   server.reset();  // or Shutdown()
#ifndef LAZYATTN_SERVICES_WORKER_SERVER_WORKER_SERVER_H_
#define LAZYATTN_SERVICES_WORKER_SERVER_WORKER_SERVER_H_

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include <prometheus/registry.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/grpc_util.h"
#include "common/metrics.h"
#include "common/tls_expiry_metrics.h"
#include "services/worker/engine/engine.h"
#include "services/worker/server/kvdir_publisher.h"
#include "services/worker/server/worker_metrics.h"
#include "services/worker/server/worker_service.h"

namespace lazyattn {

struct WorkerServerOptions {
  // Socket, message limits and TLS of the Worker service. Port 0 picks a free port.
  ServerOptions grpc;
  // Where the router reaches this worker (sent to kvdir). Empty: the listen host and the bound
  // port, with this machine's hostname for a wildcard host (0.0.0.0, [::]).
  std::string advertise_address;
  std::string metrics_address;  // empty: no /metrics endpoint
  // Non-empty: /metrics requires "Authorization: Bearer <the file's token>" (read at start).
  std::string metrics_bearer_token_file;
  std::string model_name;  // the metrics' model label
  EngineOptions engine;
  RequestLimits limits;
  WorkerServiceOptions service;  // worker_id empty: the advertised address
  std::optional<KvdirPublisherOptions> kvdir;  // unset: standalone, nothing is published
  // Shutdown: how long calls may take to end after their requests were cancelled.
  absl::Duration shutdown_grace = absl::Seconds(5);
  // Drain: how long calls in flight may run to completion before they are cancelled.
  absl::Duration drain_timeout = absl::Seconds(30);
  // Drain: how long, from its start and within drain_timeout, the port stays open answering
  // health NOT_SERVING (and handing new calls back) before gRPC stops taking calls. A router's
  // probe (every 500 ms by default) then sees NOT_SERVING and ejects the worker at once, as a
  // load balancer's health check does, instead of finding the port closed.
  absl::Duration drain_announce = absl::Seconds(1);
  absl::Duration metrics_refresh = absl::Seconds(1);
};

class WorkerServer {
 public:
  // Borrowed model pointers must outlive the server. InvalidArgument naming the option for a bad
  // value; Unavailable naming the address when a port cannot be bound.
  static absl::StatusOr<std::unique_ptr<WorkerServer>> Create(const WorkerServerOptions& options,
                                                              const ModelWeights* weights,
                                                              const Tokenizer* tokenizer);
  // Serves from `runner` (any backend; its KV storage replaces options.engine.num_kv_blocks).
  // `model_fingerprint` is ModelFingerprint() of the weights the runner holds.
  static absl::StatusOr<std::unique_ptr<WorkerServer>> Create(const WorkerServerOptions& options,
                                                              std::unique_ptr<ModelRunner> runner,
                                                              std::string model_fingerprint,
                                                              const Tokenizer* tokenizer);
  ~WorkerServer();  // Shutdown()
  WorkerServer(const WorkerServer&) = delete;
  WorkerServer& operator=(const WorkerServer&) = delete;

  // Idempotent. Marks the health service NOT_SERVING, refuses new calls, cancels running requests
  // (their calls end with UNAVAILABLE), stops the gRPC server, closes the kvdir stream.
  void Shutdown();
  // Graceful stop (SIGTERM): health NOT_SERVING, requests not started yet (waiting for
  // preparation or admission, no token sent) handed back at once (UNAVAILABLE "worker shutting
  // down" with the worker's trailer: the router retries them elsewhere), every cached document
  // withdrawn from kvdir and the publisher stopped, for options.drain_announce new calls handed
  // back as the unstarted ones and health readable, then new calls refused (UNAVAILABLE, so the
  // router fails over), running calls left to finish for up to options.drain_timeout (then ended by
  // the worker itself: UNAVAILABLE "shutting down" with its trailer, as a router expects of a
  // drain), then Shutdown(). True when every call finished before the drain timeout. Idempotent
  // (false after Shutdown).
  bool Drain();
  // Cuts a drain short (an operator's second stop signal): a Drain() in progress, or one started
  // later, stops waiting for the calls in flight and ends them at once as at the drain timeout
  // (UNAVAILABLE "worker shutting down" with the worker's trailer); gRPC cancels those still open
  // one options.shutdown_grace later (their client reads nothing, so their ends never get out).
  // Drain() then returns false unless nothing was in flight. Thread-safe and non-blocking (so it
  // may be called while Drain() runs on another thread); no effect once Drain() has returned.
  void EndDrainNow();

  int port() const { return port_; }
  const std::string& address() const { return address_; }  // advertised host:port
  const std::string& worker_id() const { return worker_id_; }
  int metrics_port() const;
  Engine& engine() { return *engine_; }
  WorkerService& service() { return *service_; }
  KvdirPublisher* publisher() { return publisher_.get(); }  // null when standalone
  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }
  // Copies the engine's counters and gauges into the metrics (also done periodically). The first
  // time it finds the engine unhealthy (a broken KV pool, engine.max_consecutive_step_failures
  // failed steps, a sticky device error) it turns the worker NOT_SERVING for good: gRPC health
  // NOT_SERVING, lazyattn_worker_serving 0, the directory left (documents withdrawn, the Publish
  // stream and with it the lease ended), one log line. The engine already answers UNAVAILABLE to
  // new and queued requests, so a router fails them over.
  void RefreshMetrics();

 private:
  WorkerServer(const WorkerServerOptions& options, std::unique_ptr<Engine> engine,
               const Tokenizer* tokenizer);
  static absl::StatusOr<std::unique_ptr<WorkerServer>> Start(std::unique_ptr<WorkerServer> server);
  void RefreshLoop();
  // Withdraws every cached document from kvdir and stops the publisher (no more heartbeats: the
  // lease ends). Idempotent; blocks up to a second for the withdrawals to be sent.
  void LeaveDirectory();

  const WorkerServerOptions options_;
  // Destroyed in reverse: reactors finishing late (after the gRPC server stopped) still reach the
  // metrics, the service's request tracker and the engine.
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<WorkerMetrics> metrics_;
  std::unique_ptr<TlsExpiryMetrics> tls_metrics_;  // server.tls and kvdir.tls
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<WorkerService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<KvdirPublisher> publisher_;
  std::unique_ptr<MetricsEndpoint> metrics_endpoint_;
  int port_ = 0;
  std::string address_;
  std::string worker_id_;

  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool end_drain_now_ ABSL_GUARDED_BY(mu_) = false;  // EndDrainNow was called
  std::thread refresher_;
  std::atomic<bool> reported_unhealthy_ = false;  // RefreshMetrics runs on two threads
  // Left the directory (draining, or not serving): the kvdir snapshot is empty from now on.
  std::atomic<bool> leaving_ = false;
};

// "HOST:PORT" of `listen_address` with `port`; a wildcard host becomes this machine's hostname.
std::string AdvertisedAddress(const std::string& listen_address, int port);

// The id a worker publishing to kvdir is known by must be one kvdir takes (common/worker_id.h):
// otherwise kvdir refuses every hello and the worker, alive and healthy, never gets a request
// routed by the directory. `id` is worker.id (or --worker-id); when it is empty the advertised
// address `address` serves as the id (a `dns:///` target, say, does not). InvalidArgument naming
// worker.id otherwise.
absl::Status CheckWorkerIdForKvdir(const std::string& id, const std::string& address);

}  // namespace lazyattn

#endif  // LAZYATTN_SERVICES_WORKER_SERVER_WORKER_SERVER_H_
