// Prefetch at the router: routed like Generate (same documents, same policy), then Worker.Prefetch
// on the best `replicas` workers (0: the one a Generate would use), concurrently. A worker that
// fails with a retryable status is replaced by the next one of the plan (one cut by
// routing.prefetch_timeout_ms is not); the answer lists the workers that succeeded and fails only
// if none did.
#ifndef LAZYATTN_SERVICES_ROUTER_SERVER_PREFETCH_CALL_H_
#define LAZYATTN_SERVICES_ROUTER_SERVER_PREFETCH_CALL_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "lazyattn/v1/inference.pb.h"
#include "services/router/server/plan_cursor.h"
#include "services/router/server/router_context.h"

namespace lazyattn::router {

// Which deadline ended a Prefetch worker call that ended DEADLINE_EXCEEDED: the call carries the
// earlier of the router's own (`timeout_at`, routing.prefetch_timeout_ms from the call's start;
// InfiniteFuture when off) and the client's (`client_deadline`; InfiniteFuture when none). A tie
// is the client's. Decided by the deadlines, not by the time the call ended.
enum class PrefetchDeadline { kRouters, kClients };
PrefetchDeadline WhichPrefetchDeadline(absl::Time timeout_at, absl::Time client_deadline);

class PrefetchReactor final : public grpc::ServerUnaryReactor {
 public:
  PrefetchReactor(RouterContext* router, grpc::CallbackServerContext* context,
                  const lazyattn::v1::PrefetchRequest* request,
                  lazyattn::v1::PrefetchResponse* response);

  void OnCancel() override;
  void OnDone() override;

 private:
  struct WorkerCall;

  void OnPlan(RoutePlan plan);
  // Starts calls until `wanted_` are in flight or done; empty when nothing could be started.
  std::vector<std::shared_ptr<WorkerCall>> NextCallsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What the client gets when the plan's first round started no call.
  grpc::Status NothingStartedStatusLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `calls` is not empty: they keep the reactor alive until this returns.
  void Launch(const std::vector<std::shared_ptr<WorkerCall>>& calls);
  // How a cancellation ends the call: CANCELLED by the client, or UNAVAILABLE when the router's
  // shutdown cut it.
  grpc::Status CancelledStatus() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnWorkerDone(const std::shared_ptr<WorkerCall>& call, const grpc::Status& worker_status);

  RouterContext* const router_;
  grpc::CallbackServerContext* const context_;
  const lazyattn::v1::PrefetchRequest* const request_;
  lazyattn::v1::PrefetchResponse* const response_;
  // The API key's cache namespace, sent to each worker (kCacheNamespaceMetadata).
  const std::string cache_namespace_;
  lazyattn::v1::PrefetchRequest worker_request_;
  // ExpectedModelValue of the chosen model, sent to each worker (empty: no model known).
  std::string expected_model_;
  // The chosen model's metrics (selections and retries count under it).
  ModelMetrics* model_metrics_;
  bool admitted_ = false;

  absl::Mutex mu_;
  RoutePlan plan_ ABSL_GUARDED_BY(mu_);
  PlanCursor cursor_ ABSL_GUARDED_BY(mu_);
  size_t calls_started_ ABSL_GUARDED_BY(mu_) = 0;
  size_t wanted_ ABSL_GUARDED_BY(mu_) = 1;
  size_t outstanding_ ABSL_GUARDED_BY(mu_) = 0;
  size_t succeeded_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::shared_ptr<WorkerCall>> active_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> failures_ ABSL_GUARDED_BY(mu_);
  grpc::StatusCode last_code_ ABSL_GUARDED_BY(mu_) = grpc::StatusCode::UNAVAILABLE;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_by_shutdown_ ABSL_GUARDED_BY(mu_) = false;  // during the router's shutdown
};

}  // namespace lazyattn::router

#endif  // LAZYATTN_SERVICES_ROUTER_SERVER_PREFETCH_CALL_H_
