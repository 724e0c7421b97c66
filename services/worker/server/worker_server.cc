#include "services/worker/server/worker_server.h"

#include <grpc/grpc.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/auth.h"
#include "common/grpc_util.h"
#include "common/log.h"
#include "common/monotonic_time.h"
#include "common/status_macros.h"
#include "common/worker_id.h"
#include "services/worker/server/handed_back.h"

namespace lazyattn {
namespace {

absl::Status Validate(const WorkerServerOptions& o) {
  auto positive = [](const char* name, int64_t v) -> absl::Status {
    if (v > 0) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(name, ": must be > 0, got ", v));
  };
  if (o.grpc.listen_address.empty()) return absl::InvalidArgumentError("listen_address: empty");
  for (absl::Status s : {positive("engine.num_kv_blocks", o.engine.num_kv_blocks),
                         positive("engine.max_batch_tokens", o.engine.max_batch_tokens),
                         positive("engine.max_running", o.engine.max_running),
                         positive("limits.max_documents", o.limits.max_documents),
                         positive("service.default_max_tokens", o.service.default_max_tokens),
                         positive("service.max_buffered_tokens", o.service.max_buffered_tokens),
                         positive("grpc.max_message_bytes", o.grpc.max_message_bytes)}) {
    if (!s.ok()) return s;
  }
  return PrepPool::Validate(o.service.prep);
}

}  // namespace

std::string AdvertisedAddress(const std::string& listen_address, int port) {
  const size_t colon = listen_address.rfind(':');
  std::string host = colon == std::string::npos ? listen_address : listen_address.substr(0, colon);
  if (host.empty() || host == "0.0.0.0" || host == "[::]" || host == "::") {
    char name[256] = {};
    host = gethostname(name, sizeof(name) - 1) == 0 && name[0] != '\0' ? name : "localhost";
  }
  return absl::StrCat(host, ":", port);
}

absl::Status CheckWorkerIdForKvdir(const std::string& id, const std::string& address) {
  if (!id.empty()) {
    if (IsValidWorkerId(id)) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat("worker.id: expected 1 to ", kDefaultMaxWorkerIdLength,
                     " of [A-Za-z0-9._:[]-] (what kvdir takes as a worker id), got \"", id, "\""));
  }
  if (IsValidWorkerId(address)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("worker.id: unset, so the advertised address \"", address,
                   "\" would be the worker id, which kvdir refuses (1 to ",
                   kDefaultMaxWorkerIdLength, " of [A-Za-z0-9._:[]-]): set worker.id"));
}

WorkerServer::WorkerServer(const WorkerServerOptions& options, std::unique_ptr<Engine> engine,
                           const Tokenizer* tokenizer)
    : options_(options),
      registry_(std::make_shared<prometheus::Registry>()),
      metrics_(std::make_unique<WorkerMetrics>(*registry_, options.model_name)),
      engine_(std::move(engine)) {
  WorkerServiceOptions service = options.service;
  service.max_documents = options.limits.max_documents;
  service_ = std::make_unique<WorkerService>(engine_.get(), tokenizer, metrics_.get(), service);
}

absl::StatusOr<std::unique_ptr<WorkerServer>> WorkerServer::Create(
    const WorkerServerOptions& options, const ModelWeights* weights, const Tokenizer* tokenizer) {
  if (absl::Status s = Validate(options); !s.ok()) return s;
  return Start(std::unique_ptr<WorkerServer>(new WorkerServer(
      options, std::make_unique<Engine>(weights, tokenizer, options.engine, options.limits),
      tokenizer)));
}

absl::StatusOr<std::unique_ptr<WorkerServer>> WorkerServer::Create(
    const WorkerServerOptions& options, std::unique_ptr<ModelRunner> runner,
    std::string model_fingerprint, const Tokenizer* tokenizer) {
  if (runner == nullptr) return absl::InvalidArgumentError("worker server: no model runner");
  WorkerServerOptions o = options;
  o.engine.num_kv_blocks = runner->num_kv_blocks();
  if (absl::Status s = Validate(o); !s.ok()) return s;
  auto engine = std::make_unique<Engine>(std::move(runner), std::move(model_fingerprint), tokenizer,
                                         o.engine, o.limits);
  return Start(std::unique_ptr<WorkerServer>(new WorkerServer(o, std::move(engine), tokenizer)));
}

absl::StatusOr<std::unique_ptr<WorkerServer>> WorkerServer::Start(
    std::unique_ptr<WorkerServer> server) {
  const WorkerServerOptions& options = server->options_;
  auto endpoint = StartMetricsEndpoint(options.metrics_address,
                                       options.metrics_bearer_token_file, server->registry_);
  if (!endpoint.ok()) return endpoint.status();
  server->metrics_endpoint_ = std::move(*endpoint);
  ServerOptions grpc_options = options.grpc;
  if (!grpc_options.tls.ca_file.empty() && grpc_options.auth_processor == nullptr) {
    // Mutual TLS: prompts and documents reach a worker only from routers (common/auth.h).
    grpc_options.auth_processor = std::make_shared<RoleAuthorizer>(
        std::vector<MethodRole>{{"/lazyattn.v1.Worker/", kRoleRouter}});
  }
  // Routers accept a worker only through its lazyattn://worker/ID certificate: another is
  // refused at start (StartGrpcServer reads the files) and at every reload.
  grpc_options.tls.own_role = kRoleWorker;
  auto built = StartGrpcServer(grpc_options, {server->service_.get()});
  if (!built.ok()) return built.status();
  server->server_ = std::move(built->server);
  // The files passed StartGrpcServer's checks: this only finds their mirror.
  server->tls_metrics_ = std::make_unique<TlsExpiryMetrics>(*server->registry_);
  if (absl::Status s = server->tls_metrics_->Watch(kTlsRoleServer, grpc_options.tls); !s.ok()) {
    return s;
  }
  // Health by service name too (probes that name lazyattn.v1.Worker); SetServingStatus(false)
  // on drain or sickness turns every name NOT_SERVING with the overall status.
  if (auto* health = server->server_->GetHealthCheckService()) {
    health->SetServingStatus(v1::Worker::service_full_name(), true);
  }
  server->port_ = built->port;
  server->address_ = options.advertise_address.empty()
                         ? AdvertisedAddress(options.grpc.listen_address, built->port)
                         : options.advertise_address;
  if (options.kvdir.has_value()) {
    RETURN_IF_ERROR(CheckWorkerIdForKvdir(options.service.worker_id, server->address_));
  }
  server->worker_id_ =
      options.service.worker_id.empty() ? server->address_ : options.service.worker_id;
  server->service_->set_identity(server->worker_id_, server->address_);

  if (options.kvdir.has_value()) {
    WorkerService* service = server->service_.get();
    Engine* engine = server->engine_.get();
    PublisherSource source{
        .status = [service] { return service->CurrentStatus(); },
        .load = [service] { return service->CurrentLoad(); },
        // Once draining, a snapshot kvdir asks for must not bring the documents back.
        .snapshot =
            [engine, leaving = &server->leaving_] {
              CacheSnapshot snapshot = engine->CachedDocuments();
              if (leaving->load()) snapshot.documents.clear();
              return snapshot;
            }};
    auto publisher = KvdirPublisher::Create(*options.kvdir, std::move(source));
    if (!publisher.ok()) return publisher.status();
    server->publisher_ = std::move(*publisher);
    // The publisher's channel checked the files: this only finds their mirror.
    if (absl::Status s = server->tls_metrics_->Watch(kTlsRoleClient, options.kvdir->tls); !s.ok()) {
      return s;
    }
    KvdirPublisher* p = server->publisher_.get();
    engine->set_cache_listener([p](const CacheEvent& e) { p->OnCacheEvent(e); });
  }
  server->refresher_ = std::thread([s = server.get()] { s->RefreshLoop(); });
  return server;
}

WorkerServer::~WorkerServer() {
  Shutdown();  // preparation stopped: nothing submits to the engine any more
  // Engine first: it ends its last requests (their reactors reach metrics_ and service_).
  engine_.reset();
  service_.reset();
}

int WorkerServer::metrics_port() const {
  return metrics_endpoint_ == nullptr ? 0 : metrics_endpoint_->port();
}

void WorkerServer::RefreshMetrics() {
  WorkerMetrics::PublisherCounts publisher;
  if (publisher_ != nullptr) {
    const KvdirPublisher::Stats s = publisher_->stats();
    publisher = {.connected = s.connected, .events_dropped = s.events_dropped};
  }
  metrics_->Refresh(engine_->stats(), engine_->blocks(), engine_->load(), publisher);
  // An engine that stopped serving (a KV pool found inconsistent, failed steps, a sticky device
  // error) refuses every request: say so to health checks (load balancers, the router,
  // Kubernetes) and the directory once, and in the log.
  if (const absl::Status health = engine_->health();
      !health.ok() && !reported_unhealthy_.exchange(true)) {
    LogError("worker").Str("reason", std::string(health.message())).Msg("NOT_SERVING");
    metrics_->SetServing(false);
    if (server_ != nullptr) {
      if (auto* service = server_->GetHealthCheckService()) service->SetServingStatus(false);
    }
    LeaveDirectory();
  }
}

void WorkerServer::LeaveDirectory() {
  if (publisher_ == nullptr || leaving_.exchange(true)) return;
  // Leave at once instead of when the lease runs out: withdraw every document (EVICTED events,
  // numbered after the cache's last event), give the publisher a moment to send them, then close
  // the stream.
  engine_->set_cache_listener({});
  const CacheSnapshot cached = engine_->CachedDocuments();
  const KvdirPublisher::Stats before = publisher_->stats();
  uint64_t version = cached.version;
  for (const CachedDocumentInfo& d : cached.documents) {
    publisher_->OnCacheEvent(CacheEvent{
        .key = d.key, .num_tokens = d.num_tokens, .stored = false, .version = ++version});
  }
  const int64_t target =
      before.events_sent + before.events_dropped + static_cast<int64_t>(cached.documents.size());
  const absl::Time give_up = MonotonicNow() + absl::Seconds(1);
  while (MonotonicNow() < give_up) {
    const KvdirPublisher::Stats now = publisher_->stats();
    if (!now.connected || now.events_sent + now.events_dropped >= target) break;
    absl::SleepFor(absl::Milliseconds(5));
  }
  publisher_->Stop();
}

void WorkerServer::RefreshLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    lock.unlock();
    RefreshMetrics();
    lock.lock();
    cv_.wait_for(lock, absl::ToChronoMilliseconds(options_.metrics_refresh),
                 [&] { return stopping_; });
  }
}

bool WorkerServer::Drain() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return false;
  }
  // The drain's time runs from here: the announcement below is part of it.
  const absl::Time deadline = MonotonicNow() + options_.drain_timeout;
  if (server_ != nullptr) {
    if (auto* health = server_->GetHealthCheckService()) health->SetServingStatus(false);
  }
  metrics_->SetServing(false);
  // Requests accepted but not started (waiting for preparation, or for admission with no token
  // sent) would stretch the drain by their whole wait, and the timeout may cut them after it: hand
  // them back now. Their calls end UNAVAILABLE with the worker's trailer before any token, which a
  // router retries on another worker at once and never counts as a lost call. Running ones go on.
  engine_->EndUnstarted(HandedBack(absl::UnavailableError(
      "worker shutting down: draining, and the request had not started; retry it elsewhere")));
  service_->StopPreparation();
  LeaveDirectory();
  bool finished = true;
  if (server_ != nullptr) {
    LogInfo("worker")
        .Int("in_flight", service_->in_flight())
        .Str("drain_timeout", absl::FormatDuration(options_.drain_timeout))
        .Msg("draining");
    // Announce the drain before the port closes: health answers NOT_SERVING, which routers'
    // probes eject on at once and load balancers read, and new calls are handed back by the
    // stopped preparation (the router moves them without counting a lost call). Once gRPC's
    // Shutdown begins, probes and calls are refused at the connection instead, which a router
    // only counts as failed probes. Running calls go on meanwhile; a second signal cuts it short.
    {
      const absl::Time announced_until =
          std::min(deadline, MonotonicNow() + options_.drain_announce);
      std::unique_lock<std::mutex> lock(mu_);
      while (!end_drain_now_ && MonotonicNow() < announced_until) {
        cv_.wait_for(lock, std::chrono::milliseconds(10));
      }
    }
    // gRPC refuses new calls from the Shutdown call on, and lets those in flight run. At the
    // deadline the worker ends what is left itself: UNAVAILABLE "shutting down" with its
    // trailer, which a router fails over as a drain. gRPC's own cancellation (a grace later, for
    // calls the engine no longer holds) would end them without the trailer, and a router
    // counts such an end as a lost worker, quarantining the content after two.
    bool shutdown_returned = false;  // guarded by mu_
    std::thread shutdown([this, deadline, &shutdown_returned] {
      server_->Shutdown(GrpcMonotonicDeadline(deadline + options_.shutdown_grace));
      {
        std::lock_guard<std::mutex> lock(mu_);
        shutdown_returned = true;
      }
      cv_.notify_all();
    });
    bool ended_now;
    {
      // The tracker does not notify when a call ends: look every 10 ms. EndDrainNow notifies.
      std::unique_lock<std::mutex> lock(mu_);
      while (!end_drain_now_ && service_->in_flight() > 0 && MonotonicNow() < deadline) {
        cv_.wait_for(lock, std::chrono::milliseconds(10));
      }
      ended_now = end_drain_now_;
    }
    finished = service_->in_flight() == 0;
    if (!finished) {
      LogWarning("worker")
          .Int("in_flight", service_->in_flight())
          .Msg(ended_now ? "drain ended early; ending the requests still running as shutting down"
                         : "drain timeout reached; ending the requests still running as "
                           "shutting down");
      service_->Drain();
    }
    if (ended_now) {
      // gRPC's own cancellation is set for the drain's deadline: bring it forward to one grace
      // from now, as at the timeout, for calls whose end cannot get out.
      std::unique_lock<std::mutex> lock(mu_);
      if (!cv_.wait_for(lock, absl::ToChronoMilliseconds(options_.shutdown_grace),
                        [&] { return shutdown_returned; })) {
        lock.unlock();
        grpc_server_cancel_all_calls(server_->c_server());
      }
    }
    shutdown.join();
    server_->Wait();
  }
  Shutdown();
  return finished;
}

void WorkerServer::EndDrainNow() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    end_drain_now_ = true;
  }
  cv_.notify_all();
}

void WorkerServer::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  cv_.notify_all();
  if (refresher_.joinable()) refresher_.join();
  if (server_ != nullptr) {
    if (auto* health = server_->GetHealthCheckService()) health->SetServingStatus(false);
    service_->Drain();
    // Calls end as soon as the engine has processed the cancellations; after the grace period
    // gRPC cancels whatever is left. Shutdown returns once every reactor is done.
    server_->Shutdown(GrpcMonotonicDeadline(MonotonicNow() + options_.shutdown_grace));
    server_->Wait();
  }
  // Preparations still running submit to the engine: they end while it is alive.
  if (service_ != nullptr) service_->StopPreparation();
  if (publisher_ != nullptr) {
    engine_->set_cache_listener({});
    publisher_->Stop();
  }
  RefreshMetrics();
  metrics_endpoint_.reset();
}

}  // namespace lazyattn
