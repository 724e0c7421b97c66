#include "services/kvdir/server/kvdir_server.h"

#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/auth.h"
#include "common/log.h"
#include "common/monotonic_time.h"

namespace lazyattn::kvdir {
namespace {

absl::Status Validate(const KvdirOptions& o) {
  if (o.listen_address.empty()) return absl::InvalidArgumentError("listen_address: empty");
  if (o.lease_ms <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("lease_ms: must be > 0, got ", o.lease_ms));
  }
  if (o.limits.max_keys_per_lookup <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("limits.max_keys_per_lookup: must be > 0, got ",
                                                   o.limits.max_keys_per_lookup));
  }
  if (o.limits.max_workers <= 0 || o.limits.max_entries_per_worker <= 0 ||
      o.limits.max_entries <= 0 || o.limits.max_worker_id_length <= 0) {
    return absl::InvalidArgumentError(
        "limits.max_workers, max_entries_per_worker, max_entries, max_worker_id_length: must be "
        "> 0");
  }
  if (o.limits.max_publish_streams <= 0 || o.limits.max_streams_per_certificate <= 0 ||
      o.limits.hello_timeout_ms <= 0) {
    return absl::InvalidArgumentError(
        "limits.max_publish_streams, max_streams_per_certificate, hello_timeout_ms: must be > 0");
  }
  // A full snapshot a second at least: below that, a worker holding max_entries_per_worker
  // entries that reconnects a few times in a row would be shut out.
  if (o.limits.max_publish_entries_per_s < -1 ||
      (o.limits.max_publish_entries_per_s > 0 &&
       o.limits.max_publish_entries_per_s < o.limits.max_entries_per_worker)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "limits.max_publish_entries_per_s: 0 (no bound) or at least limits.max_entries_per_worker "
        "(",
        o.limits.max_entries_per_worker, "), got ", o.limits.max_publish_entries_per_s));
  }
  if (o.slow_work_threads < 0 || o.slow_work_threads > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("slow_work_threads: 0 (automatic) to 64, got ", o.slow_work_threads));
  }
  if (o.limits.max_message_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("limits.max_message_bytes: must be > 0, got ", o.limits.max_message_bytes));
  }
  return absl::OkStatus();
}

// Workers leave within lease + one tick of their last message; Lookup hides them at once anyway.
absl::Duration SweepInterval(int64_t lease_ms) {
  return std::clamp(absl::Milliseconds(lease_ms) / 4, absl::Milliseconds(10),
                    absl::Milliseconds(250));
}

}  // namespace

KvdirServer::KvdirServer(const KvdirOptions& options)
    : options_(options),
      registry_(std::make_shared<prometheus::Registry>()),
      metrics_(*registry_),
      index_(absl::Milliseconds(options.lease_ms),
             IndexLimits{.max_workers = options.limits.max_workers,
                         .max_entries_per_worker = options.limits.max_entries_per_worker,
                         .max_entries = options.limits.max_entries}),
      streams_(PublishStreamLimits{
          .max_streams = options.limits.max_publish_streams,
          .max_per_certificate = options.limits.max_streams_per_certificate,
          .hello_timeout = absl::Milliseconds(options.limits.hello_timeout_ms),
          .entries_per_s = options.limits.max_publish_entries_per_s < 0
                               ? std::max<int64_t>(options.limits.max_entries_per_worker,
                                                   kMinDefaultPublishEntriesPerS)
                               : options.limits.max_publish_entries_per_s}),
      // Half the cores, the rest left to gRPC's threads and lookups; snapshots beyond wait.
      slow_work_(options.slow_work_threads > 0
                     ? options.slow_work_threads
                     : std::clamp(static_cast<int>(std::thread::hardware_concurrency()) / 2, 1, 4)),
      service_(ServiceContext{.index = &index_,
                              .metrics = &metrics_,
                              .streams = &streams_,
                              .slow_work = &slow_work_,
                              .lease_ms = options.lease_ms,
                              .max_keys_per_lookup = options.limits.max_keys_per_lookup,
                              .max_entries_per_worker = options.limits.max_entries_per_worker,
                              .max_entries = options.limits.max_entries,
                              .max_worker_id_length = options.limits.max_worker_id_length}) {}

absl::StatusOr<std::unique_ptr<KvdirServer>> KvdirServer::Create(const KvdirOptions& options) {
  if (absl::Status s = Validate(options); !s.ok()) return s;
  std::unique_ptr<KvdirServer> server(new KvdirServer(options));
  auto endpoint = StartMetricsEndpoint(options.metrics_address,
                                       options.metrics_bearer_token_file, server->registry_);
  if (!endpoint.ok()) return endpoint.status();
  server->metrics_endpoint_ = std::move(*endpoint);
  ServerOptions grpc_options;
  grpc_options.listen_address = options.listen_address;
  grpc_options.max_message_bytes = options.limits.max_message_bytes;
  grpc_options.tls = options.tls;
  grpc_options.reflection = options.reflection;
  // A Publish stream lasts as long as its worker: past the connection's age and this grace it is
  // cut, and its worker reconnects with a new handshake (grpc_util.h, kMaxConnectionAgeMs).
  grpc_options.max_connection_age_grace_ms = kPublishConnectionGraceMs;
  if (!options.tls.ca_file.empty()) {
    // Mutual TLS: the directory's writers are workers, its readers routers (common/auth.h).
    grpc_options.auth_processor = std::make_shared<RoleAuthorizer>(std::vector<MethodRole>{
        {"/lazyattn.v1.KvDirectory/Publish", kRoleWorker},
        {"/lazyattn.v1.KvDirectory/Lookup", kRoleRouter},
        {"/lazyattn.v1.KvDirectory/ListWorkers", kRoleRouter}});
  }
  // Routers and workers accept kvdir only through a lazyattn://kvdir/ certificate: another is
  // refused at start (StartGrpcServer reads the files) and at every reload.
  grpc_options.tls.own_role = kRoleKvdir;
  auto built = StartGrpcServer(grpc_options, {&server->service_});
  if (!built.ok()) return built.status();
  server->server_ = std::move(built->server);
  server->port_ = built->port;
  // The files passed StartGrpcServer's checks: this only finds their mirror.
  server->tls_metrics_ = std::make_unique<TlsExpiryMetrics>(*server->registry_);
  if (absl::Status s = server->tls_metrics_->Watch(kTlsRoleServer, grpc_options.tls); !s.ok())
    return s;
  // Health by service name too (probes that name the API); the overall status, set NOT_SERVING
  // at shutdown, turns every name with it.
  if (auto* health = server->server_->GetHealthCheckService()) {
    health->SetServingStatus(lazyattn::v1::KvDirectory::service_full_name(), true);
  }
  server->sweeper_ = std::thread([s = server.get()] { s->SweepLoop(); });
  return server;
}

KvdirServer::~KvdirServer() { Shutdown(); }

int KvdirServer::metrics_port() const {
  return metrics_endpoint_ == nullptr ? 0 : metrics_endpoint_->port();
}

void KvdirServer::SweepLoop() {
  const absl::Duration interval = SweepInterval(options_.lease_ms);
  while (true) {
    {
      std::unique_lock<std::mutex> lock(stop_mu_);
      if (stop_cv_.wait_for(lock, absl::ToChronoNanoseconds(interval), [&] { return stop_; })) {
        return;
      }
    }
    for (const SilentStream& silent : streams_.CancelSilent(MonotonicNow())) {
      metrics_.LimitRefused(KvdirMetrics::Limit::kHelloTimeout);
      LogWarning("kvdir")
          .Str("certificate", silent.certificate_id.empty() ? "none" : silent.certificate_id)
          .Str("peer_host", silent.peer_host)
          .Int("open_ms", absl::ToInt64Milliseconds(silent.open_for))
          .Int("hello_timeout_ms", options_.limits.hello_timeout_ms)
          .Msg("cancelled a Publish stream that said no hello within limits.hello_timeout_ms");
    }
    const SweepResult sweep = index_.Sweep(MonotonicNow());
    if (sweep.stalled > absl::ZeroDuration()) {
      // One line per stall: the directory (not the workers) stopped, e.g. SIGSTOP or a paused
      // host; expiring everyone now would empty every router's worker list.
      LogWarning("kvdir")
          .Int("stalled_ms", absl::ToInt64Milliseconds(sweep.stalled))
          .Int("leases_extended", sweep.extended)
          .Msg(
              "the directory did not run for longer than half a lease; no lease expires in "
              "this sweep, every lease runs one more lease so live workers renew it");
    }
    const std::vector<std::string>& expired = sweep.expired;
    for (const std::string& id : expired) {
      LogWarning("kvdir").Str("worker", id).Msg("lease expired; its entries are dropped");
    }
    if (!expired.empty()) {
      metrics_.LeasesExpired(static_cast<int64_t>(expired.size()));
      // The index freed the workers' entries; glibc keeps freed small blocks in its arenas
      // unless asked, and a directory that just lost large workers should shrink back.
      malloc_trim(0);
    }
    metrics_.SetIndexStats(index_.Stats());
    metrics_.SetPublishStreams(streams_.open_streams());
    // From here the sweeper only waits: a stall is time away from here, not this iteration's
    // work (Stats may wait behind a large snapshot, malloc_trim on a large heap).
    index_.SweeperWaits(MonotonicNow());
  }
}

void KvdirServer::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(stop_mu_);
    if (stop_) return;
    stop_ = true;
  }
  stop_cv_.notify_all();
  if (sweeper_.joinable()) sweeper_.join();
  if (server_ != nullptr) {
    // Publish streams never end on their own: after the grace period gRPC cancels them, their
    // reactors finish, and Shutdown returns once every reactor is done.
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
    server_->Wait();
  }
}

}  // namespace lazyattn::kvdir
