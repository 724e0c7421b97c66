// One Worker.Prefetch call (gRPC callback API): runs the documents through the engine without
// generating (see PrefetchEngineRequest) so they land in the document cache, and reports how many
// document tokens were computed and how many were cached already. Validated on gRPC's thread with
// the shared validator; tokenized on the PrepPool as Generate is (a full queue answers
// RESOURCE_EXHAUSTED). Client cancellation and the deadline reach the queued preparation and the
// engine as for Generate. Deletes itself once gRPC and the engine are both done with it.
//
// Lock order: mu_, then RequestTracker's lock and the engine's submission lock; PrepPool calls
// (through prep_) are made without mu_ (Cancel runs the task, which takes it).
#ifndef LAZYATTN_SERVICES_WORKER_SERVER_PREFETCH_REACTOR_H_
#define LAZYATTN_SERVICES_WORKER_SERVER_PREFETCH_REACTOR_H_

#include <atomic>
#include <cstdint>
#include <mutex>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "lazyattn/v1/inference.pb.h"
#include "services/worker/engine/request.h"
#include "services/worker/server/prep_ticket.h"
#include "services/worker/server/service_context.h"

namespace lazyattn {

class PrefetchReactor final : public grpc::ServerUnaryReactor {
 public:
  PrefetchReactor(const ServiceContext& ctx, grpc::CallbackServerContext* call,
                  const v1::PrefetchRequest& request, v1::PrefetchResponse* response);

  void OnCancel() override;
  void OnDone() override;

 private:
  void Prepare(const absl::Status& status);  // the PrepPool's task (see GenerateReactor)
  void PrepareAndSubmit(const absl::Status& status);
  void OnEngineDone(const absl::Status& status, const RequestResult& result);  // engine thread
  void Unref();

  const ServiceContext ctx_;
  v1::PrefetchResponse* const response_;
  const absl::Time deadline_;
  std::atomic<int> refs_{1};
  EngineRequest request_;  // converted; handed to the pool thread, then to the engine
  PrepTicket prep_;        // its place in the PrepPool

  std::mutex mu_;
  bool submitted_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t engine_id_ ABSL_GUARDED_BY(mu_) = 0;
  bool engine_done_ ABSL_GUARDED_BY(mu_) = false;
  bool cancel_engine_ ABSL_GUARDED_BY(mu_) = false;
  bool client_cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace lazyattn

#endif  // LAZYATTN_SERVICES_WORKER_SERVER_PREFETCH_REACTOR_H_
