// lazyattn.v1.Worker over an Engine (gRPC callback API): Generate (GenerateReactor), Prefetch
// (PrefetchReactor) and Status. Status, and the kvdir publisher's Hello and heartbeats, report the
// same WorkerStatus / WorkerLoad built here.
#ifndef LAZYATTN_SERVICES_WORKER_SERVER_WORKER_SERVICE_H_
#define LAZYATTN_SERVICES_WORKER_SERVER_WORKER_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include <functional>
#include <mutex>
#include <string>

#include "absl/base/thread_annotations.h"
#include "common/request_validator.h"
#include "lazyattn/v1/worker.grpc.pb.h"
#include "services/worker/engine/engine.h"
#include "services/worker/server/prep_pool.h"
#include "services/worker/server/request_tracker.h"
#include "services/worker/server/service_context.h"
#include "services/worker/server/worker_metrics.h"

namespace lazyattn {

struct WorkerServiceOptions {
  std::string worker_id;      // reported in Final.worker, Status and to kvdir (see set_identity)
  std::string model_name;     // ModelInfo.name (default: the model config's name)
  int max_documents = 64;     // ModelInfo.max_documents (the engine enforces it)
  int default_max_tokens = 128;
  int max_buffered_tokens = 1024;  // see ServiceContext
  // Request limits, the same as the router's (YAML limits.*); max_documents is overridden by
  // max_documents above.
  ApiLimits limits;
  PrepPoolOptions prep;  // threads that tokenize requests, and how many may wait for them
  // testing.abort_on_prompt_marker (fault_injection.h): non-empty only in fault-injection tests.
  std::string abort_on_prompt_marker;
  std::function<void()> after_submit_for_test;  // ServiceContext's; tests only
};

class WorkerService final : public v1::Worker::CallbackService {
 public:
  // Borrowed pointers must outlive the service and every call it started.
  WorkerService(Engine* engine, const Tokenizer* tokenizer, WorkerMetrics* metrics,
                const WorkerServiceOptions& options);

  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext* context, const v1::GenerateRequest* request) override;
  grpc::ServerUnaryReactor* Prefetch(grpc::CallbackServerContext* context,
                                     const v1::PrefetchRequest* request,
                                     v1::PrefetchResponse* response) override;
  grpc::ServerUnaryReactor* Status(grpc::CallbackServerContext* context,
                                   const v1::WorkerStatusRequest* request,
                                   v1::WorkerStatus* response) override;

  // The worker's id and where the router reaches it (host:port), once the server has bound its
  // port (either may derive from the port).
  void set_identity(const std::string& worker_id, const std::string& address);
  v1::WorkerStatus CurrentStatus() const;
  v1::WorkerLoad CurrentLoad() const;

  // New calls get UNAVAILABLE; calls in flight have their engine requests cancelled and end with
  // UNAVAILABLE ("worker shutting down").
  void Drain();
  // Engine requests started by calls and not finished yet.
  size_t in_flight() const { return tracker_.size(); }
  // Ends preparation: requests still waiting for it end with UNAVAILABLE, running preparations
  // are waited for. Before the engine goes away (preparation submits to it). Idempotent.
  void StopPreparation() { prep_.Shutdown(); }
  PrepPool& prep_pool() { return prep_; }

 private:
  ServiceContext context() const;

  v1::ModelInfo model_info_;
  RequestTracker tracker_;
  PrepPool prep_;  // after tracker_: its tasks reach the tracker until it stops
  mutable std::mutex mu_;
  ServiceContext ctx_ ABSL_GUARDED_BY(mu_);
  std::string address_ ABSL_GUARDED_BY(mu_);
};

}  // namespace lazyattn

#endif  // LAZYATTN_SERVICES_WORKER_SERVER_WORKER_SERVICE_H_
