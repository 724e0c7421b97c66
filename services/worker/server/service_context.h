// What the worker's RPC handlers share (borrowed pointers; the WorkerServer owns them and keeps
// them alive until every RPC and every engine request has ended).
#ifndef LAZYATTN_SERVICES_WORKER_SERVER_SERVICE_CONTEXT_H_
#define LAZYATTN_SERVICES_WORKER_SERVER_SERVICE_CONTEXT_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "absl/time/time.h"
#include "common/monotonic_time.h"
#include "common/request_validator.h"
#include "services/worker/engine/engine.h"
#include "services/worker/server/prep_pool.h"
#include "services/worker/server/request_convert.h"
#include "services/worker/server/request_tracker.h"
#include "services/worker/server/requested_model.h"
#include "services/worker/server/worker_metrics.h"

namespace lazyattn {

struct ServiceContext {
  Engine* engine = nullptr;
  const Tokenizer* tokenizer = nullptr;
  WorkerMetrics* metrics = nullptr;
  RequestTracker* tracker = nullptr;
  // Where requests are tokenized (never on gRPC's callback threads).
  PrepPool* prep = nullptr;
  // The router's limits, enforced again here: a worker is reachable directly.
  ApiLimits limits;
  ConvertOptions convert;
  // Generated tokens a stream may hold for a slow client before its request is cancelled with
  // RESOURCE_EXHAUSTED (the engine thread never waits for a client).
  int max_buffered_tokens = 1024;
  std::string worker_id;
  // ExpectedModelValue of the weights this worker serves (common/worker_call_trailer.h).
  std::string model_key;
  // What requests may name that model by (GenerateRequest.model, CheckRequestedModel).
  ServedModelNames served_model;
  // Fault injection (testing.abort_on_prompt_marker): a Generate whose text contains it aborts
  // the process while it is prepared. Empty: off.
  std::string abort_on_prompt_marker;
  // Tests only: called on the preparing thread just after a Generate was handed to the engine,
  // the moment from which the engine may finish it and its call end under that thread. Null: off.
  std::function<void()> after_submit_for_test;
};

// UNAVAILABLE when the router routed `call` for another model than `model_key`
// (ServiceContext::model_key; the kExpectedModelKey metadata, common/worker_call_trailer.h);
// nullopt when it names this worker's model or nothing.
std::optional<grpc::Status> RefuseOtherModel(const grpc::CallbackServerContext& call,
                                             const std::string& model_key);

// The request's `model` (GenerateRequest.model, PrefetchRequest.model) checked against this
// worker's model (CheckRequestedModel), after RefuseOtherModel: a call that carries the router's
// expected-model metadata was routed to this model, whatever name the router resolved.
absl::Status CheckCallsModel(const grpc::CallbackServerContext& call, const ServiceContext& ctx,
                             std::string_view requested);

// The API key's cache namespace the router sent with `call` (kCacheNamespaceMetadata,
// common/document_key.h); empty when it sent none (no API keys, or a caller other than a router).
std::string CacheNamespaceOf(const grpc::CallbackServerContext& call);

// The call's gRPC deadline (a wall-clock date) as the MonotonicNow() value the engine keeps its
// deadlines in, converted once on arrival as gRPC itself does (InfiniteFuture when the call has
// none): a wall clock stepped afterwards neither expires the request early nor keeps it late.
inline absl::Time DeadlineOf(std::chrono::system_clock::time_point deadline) {
  if (deadline == std::chrono::system_clock::time_point::max()) return absl::InfiniteFuture();
  return MonotonicNow() + (absl::FromChrono(deadline) - absl::Now());
}

}  // namespace lazyattn

#endif  // LAZYATTN_SERVICES_WORKER_SERVER_SERVICE_CONTEXT_H_
