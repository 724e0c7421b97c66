// State shared by every call the router serves, and the routing step they all use:
// document keys -> kvdir Lookup (bounded by a short deadline, asynchronous) -> WorkerSelector.
//
// Lock order: none held across calls into another component; each component locks only itself.
#ifndef LAZYATTN_SERVICES_ROUTER_SERVER_ROUTER_CONTEXT_H_
#define LAZYATTN_SERVICES_ROUTER_SERVER_ROUTER_CONTEXT_H_

#include <prometheus/registry.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/document_key.h"
#include "lazyattn/v1/inference.pb.h"
#include "lazyattn/v1/kvdir.grpc.pb.h"
#include "services/router/policy/query_quarantine.h"
#include "services/router/policy/worker_selector.h"
#include "services/router/server/client_write_watch.h"
#include "services/router/server/router_metrics.h"
#include "services/router/server/router_options.h"
#include "services/router/server/worker_registry.h"

namespace lazyattn::router {

// The outcome of routing one request.
struct RoutePlan {
  std::vector<WorkerInfo> workers;      // best first; breaker-open workers left out
  std::vector<int64_t> predicted_hits;  // per entry of `workers`
  // Per entry of `workers`: the directory's claims there when the prediction is those alone,
  // else -1 (Selection::claimed_tokens).
  std::vector<int64_t> claimed_tokens;
  std::vector<int64_t> claimed_copy_tokens;  // ... of which copyable (-1 likewise)
  std::vector<DocumentRef> docs;        // distinct documents used for routing
  bool directory_answered = false;
  bool breaker_panic = false;  // every worker was out (breaker, ejection): try them regardless
};

class RouterContext {
 public:
  // Starts health probing (health.interval; none when zero).
  RouterContext(const RouterOptions& options, prometheus::Registry& registry);
  ~RouterContext();  // stops health probing

  const RouterOptions& options() const { return options_; }
  WorkerRegistry& registry() { return registry_; }
  WorkerSelector& selector() { return selector_; }
  RouterMetrics& metrics() { return metrics_; }
  QueryQuarantine& quarantine() { return quarantine_; }
  RetryBudget& retry_budget() { return retry_budget_; }
  // Where Generate and Complete calls register to be cut when their client stops reading or
  // reads too slowly; null when routing.client_write_timeout_ms and
  // routing.client_write_wait_budget_ms are both 0.
  ClientWriteWatch* write_watch() { return write_watch_.get(); }

  // Set by RouterServer::Shutdown before it drains: a call cancelled from then on was cut by the
  // drain's end (gRPC cancels what outlasts the grace), not by its client.
  void MarkShuttingDown() { shutting_down_.store(true, std::memory_order_release); }
  bool shutting_down() const { return shutting_down_.load(std::memory_order_acquire); }

  // Backpressure: at most max_inflight_requests admitted calls at once. TryAdmit takes `places`
  // (>= 1) of them at once or none, and on refusal stores in `in_flight` (optional) the count it
  // found; Release gives back one.
  bool TryAdmit(int places = 1, int* in_flight = nullptr);
  void Release();
  // Admitted calls now (tests, diagnostics).
  int InFlight() const { return inflight_.load(std::memory_order_relaxed); }

  // Known workers with a reported status that health probing has not ejected (all reported ones
  // while probing is off). With none, requests still go to every known worker (the selector's
  // panic mode); the HTTP front's /health reports the router "degraded" then.
  int AdmittedWorkers();

  // The distinct documents of a request, keyed with `model`'s fingerprints (the request's chosen
  // model, model_choice.h; null: the only model served, WorkerRegistry::Model). Empty when no
  // model is known, or for cache modes that do not reuse documents (FULL, PREFIX): those route
  // by load. Keys are in `scope` (ScopedDocumentKey), as the workers cache and publish them.
  std::vector<DocumentRef> DocumentRefs(
      const google::protobuf::RepeatedPtrField<lazyattn::v1::Document>& documents,
      lazyattn::v1::CacheMode mode, const ModelKey* model = nullptr,
      const CacheScope& scope = {}) const;

  // Routes asynchronously: asks kvdir (when configured, the policy is cache_aware, there are
  // documents and lookups are not being skipped after failures: LookupGate) with the lookup
  // deadline, then ranks. `done` runs exactly once, on a gRPC thread
  // or inline; a directory failure only means no residency information.
  // `model` set: only workers that reported that model are ranked (and so tried), whatever the
  // directory answers; unset: every known worker (no model is known yet).
  void PlanAsync(std::vector<DocumentRef> docs, std::function<void(RoutePlan)> done,
                 std::optional<ModelKey> model = std::nullopt);
  // `now`: MonotonicNow() (worker_registry.h).
  RoutePlan Plan(std::vector<DocumentRef> docs, const lazyattn::v1::LookupResponse* lookup,
                 absl::Time now, const ModelKey* model = nullptr);

  // A request `worker` served after the directory claimed `claimed` of its document tokens
  // there, `claimed_copies` of them copyable (RoutePlan::claimed_tokens and
  // claimed_copy_tokens; ignored unless `claimed` > 0), and answered with `usage`: what it
  // reused (hits, and copies when it reports them; a worker that predates
  // document_copied_tokens has its hits checked alone) is recorded in the selector's
  // ClaimCredit. A worker losing or regaining credit is logged; lazyattn_router_workers_distrusted
  // (known workers only) follows, and is recounted at every refresh of the worker list.
  void ObserveClaim(const std::string& worker, int64_t claimed, int64_t claimed_copies,
                    const lazyattn::v1::Usage& usage);
  // Blocking: ListWorkers from kvdir and Status from each static worker (each with list_timeout).
  void RefreshWorkers();

  // One round of health probes: grpc.health.v1 Check of every known worker, in parallel, each
  // bounded by health.timeout, reported to the selector's outlier detector. Ejections and
  // re-admissions are logged and counted. Blocking (the prober thread; tests).
  void ProbeWorkersOnce();

 private:
  void ProbeLoop();
  // Logs (at most once a minute) a lookup kvdir answered with INVALID_ARGUMENT.
  void RefusedLookup(const grpc::Status& status);

  const RouterOptions options_;
  WorkerRegistry registry_;
  WorkerSelector selector_;
  RouterMetrics metrics_;
  QueryQuarantine quarantine_;
  RetryBudget retry_budget_;
  std::unique_ptr<lazyattn::v1::KvDirectory::Stub> kvdir_;
  LookupGate lookup_gate_;
  std::atomic<bool> last_listing_ok_{true};        // the last ListWorkers answered
  std::atomic<int64_t> refused_lookup_logged_ms_{INT64_MIN};  // MonotonicNow, for RefusedLookup
  std::unique_ptr<ClientWriteWatch> write_watch_;  // null: both of its limits 0
  std::atomic<int> inflight_{0};

  absl::Mutex probe_mu_;
  std::atomic<bool> shutting_down_{false};
  bool stopping_ ABSL_GUARDED_BY(probe_mu_) = false;
  std::thread prober_;
};

// Why a worker call failed: which failures may go to another worker, which count against the
// worker's circuit breaker (transport failures, INTERNAL - a worker whose device is broken fails
// every request at once - and DEADLINE_EXCEEDED when the client's own deadline has not passed).
bool IsRetryable(grpc::StatusCode code);
bool IsWorkerFault(grpc::StatusCode code);

}  // namespace lazyattn::router

#endif  // LAZYATTN_SERVICES_ROUTER_SERVER_ROUTER_CONTEXT_H_
