// The router's view of the workers: those the KV directory lists (refreshed by ListWorkers and by
// every Lookup answer) plus the static addresses from the configuration (polled with
// Worker.Status). It survives the directory going away: the last known list stays in use
// ("load-only routing from the last known workers"). A directory worker the directory stops
// listing is forgotten after `forget_after`, counted only while the directory answers: the time
// from the last answer before a failed call to the next answer is not counted, so a directory
// back from an outage longer than forget_after (restarted, still empty while its workers
// reconnect) does not empty the list with its first answer.
//
// Also keeps one channel per worker address and the router's own in-flight count per worker, and
// groups the reported workers by model (model_groups.h): a request is routed within one group.
//
// Every time here, as in the router's breakers, outlier ejection, lookup gate and quarantine, is
// a MonotonicNow() value: a wall clock stepped back (NTP, a restored VM) must not keep a departed
// worker in plans, nor one stepped forward forget every worker at once.
#ifndef LAZYATTN_SERVICES_ROUTER_SERVER_WORKER_REGISTRY_H_
#define LAZYATTN_SERVICES_ROUTER_SERVER_WORKER_REGISTRY_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/grpc_util.h"
#include "common/monotonic_time.h"
#include "lazyattn/v1/kvdir.pb.h"
#include "lazyattn/v1/worker.grpc.pb.h"
#include "services/router/server/model_groups.h"

namespace lazyattn::router {

struct WorkerInfo {
  std::string id;                     // worker_id when known, else the address
  std::string address;                // host:port
  lazyattn::v1::WorkerStatus status;  // last reported (load, model); empty when never reported
  bool reported = false;              // status came from the directory or a Status poll
  // When this worker was first seen reporting its current model (a restart with other weights
  // starts it again): how old a model version's presence is, for ResolveModel's tie-break.
  absl::Time model_since = absl::InfinitePast();
};

// Whether `address` (a gRPC target) reaches the dialling machine itself: a loopback host or a
// local socket. A router whose kvdir address is such runs a one-host cluster (tools/cluster).
bool DialsThisHost(absl::string_view address);

class WorkerRegistry {
 public:
  // `directory_on_this_host`: the router reaches kvdir on its own host (DialsThisHost). Only then
  // are workers the directory lists at loopback addresses dialled; otherwise such an address is
  // this router's own host, not the worker's, whoever listed it. (kvdir takes one only from a
  // worker that connected over loopback, which a worker on kvdir's host, or behind a proxy or
  // service mesh there, also does.) A listed address that does not dial over the network
  // (`unix:`, `dns://SERVER/`: DialsOverTheNetwork) is never dialled. Either is dropped from
  // the listing, logged at most once a minute. Static addresses are the operator's: dialled.
  WorkerRegistry(std::vector<std::string> static_addresses, TlsOptions client_tls,
                 int max_message_bytes, absl::Duration forget_after, bool directory_on_this_host);

  // A full answer from the directory (ListWorkers or Lookup): updates status and load.
  void ObserveDirectory(
      const google::protobuf::RepeatedPtrField<lazyattn::v1::WorkerResidency>& workers,
      absl::Time now);
  // A directory call (ListWorkers or Lookup) sent at `sent_at` failed or timed out: the time from
  // then (or from the last answer, if that came later) until the next answer does not count
  // towards forget_after. Only that time: the answered time before it still counts, so Lookups
  // that time out now and then between answers slow forgetting down but never stop it.
  void ObserveDirectoryFailure(absl::Time sent_at);
  // A Status poll of a static worker at `now`; nullptr when it failed. One failed poll (a busy
  // worker, a slow network) is not a departure: the worker keeps its last status until
  // forget_after has passed without a good poll, as a directory's worker stays listed.
  void ObserveStatic(const std::string& address, const lazyattn::v1::WorkerStatus* status,
                     absl::Time now = MonotonicNow());

  // Every known worker, sorted by id.
  std::vector<WorkerInfo> Snapshot() const;
  // The models of the reported workers that carry a model fingerprint, one group per
  // (model_fingerprint, tokenizer_fingerprint), with ids assigned, ordered by id (model_groups.h).
  std::vector<ModelGroup> Models() const;
  // The group `requested` (GenerateRequest.model) names among Models(): ResolveModel's contract,
  // except that "no model known and none requested" is nullopt.
  absl::StatusOr<std::optional<ModelGroup>> ResolveModel(std::string_view requested) const;
  // The only model served (exactly one group), else nullopt: with none or several, a caller
  // must resolve the request's own model (ResolveModel) to know its fingerprints or vocabulary.
  std::optional<lazyattn::v1::ModelInfo> Model() const;
  int LiveCount() const;

  // A known worker's stub and channel are kept until the worker is forgotten. One asked for an
  // address the registry no longer knows (a retry planned just before it was forgotten) is made
  // for that call and not kept: kept, it would never be freed.
  // With TLS the channel accepts only the certificate of `worker_id` (TlsOptions::server_identity),
  // the id the caller planned for (WorkerInfo::id; empty: the one listed at the address now), so a
  // request goes only to the worker it was routed to; any worker's certificate at a static
  // address (its id is only what the worker says) or where the id is the address (an id-less
  // listing). The kept channel follows the id listed at the address: one planned for another id
  // (the listing changed since) gets a channel of its own, not kept.
  absl::StatusOr<std::shared_ptr<lazyattn::v1::Worker::Stub>> Stub(
      const std::string& address, const std::string& worker_id = "");
  // The channel under Stub(address) (health probes share the worker's connection); Unavailable
  // for an address the registry does not know.
  absl::StatusOr<std::shared_ptr<grpc::Channel>> Channel(const std::string& address);
  // Channels kept (tests).
  size_t kept_channels() const;

  // The router's own calls in flight on a worker, counted by its id and address: a worker
  // restarted with the same id at a new address starts with none, whatever calls are still held
  // by the old process (frozen, say, until keepalive ends them), instead of being passed over for
  // their load (the selector takes the larger of this and the worker's own report).
  void AddInflight(const WorkerInfo& worker, int delta);
  int64_t Inflight(const WorkerInfo& worker) const;

  const std::vector<std::string>& static_addresses() const { return static_addresses_; }

 private:
  struct Entry {
    WorkerInfo info;
    bool from_directory = false;
    bool is_static = false;
    absl::Time last_listed = absl::InfinitePast();
    absl::Time last_polled = absl::InfinitePast();  // a static worker's last good Status poll
  };

  // The worker name a channel to `address` planned for `worker_id` requires of the server's
  // certificate (Stub); "" for any worker's.
  std::string ExpectedWorkerNameLocked(const std::string& address,
                                       const std::string& worker_id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::vector<std::string> static_addresses_;
  const TlsOptions client_tls_;
  const int max_message_bytes_;
  const absl::Duration forget_after_;
  const bool directory_on_this_host_;

  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Entry> by_address_ ABSL_GUARDED_BY(mu_);
  // One per known address: the channel, its stub and the worker name its certificate must carry.
  struct Dialled {
    std::shared_ptr<grpc::Channel> channel;
    std::shared_ptr<lazyattn::v1::Worker::Stub> stub;
    std::string worker_name;  // "": any worker's certificate
  };
  absl::flat_hash_map<std::string, Dialled> dialled_ ABSL_GUARDED_BY(mu_);
  // By (id, address).
  absl::flat_hash_map<std::pair<std::string, std::string>, int64_t> inflight_ ABSL_GUARDED_BY(mu_);
  absl::Time last_answer_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();  // the directory's
  // Since when the directory has not been answering: the send time of the first call that failed
  // after the last answer; InfiniteFuture while none has.
  absl::Time unanswered_since_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  absl::Time refusal_logged_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace lazyattn::router

#endif  // LAZYATTN_SERVICES_ROUTER_SERVER_WORKER_REGISTRY_H_
