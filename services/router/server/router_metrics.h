// The router's Prometheus metrics (names per CONVENTIONS). Families are built once here; labelled
// children are created up front (status codes) or once per worker id and cached, never per request.
//
//   lazyattn_router_requests_total{policy,status}   Generate and Complete requests by final gRPC
//                                                   status ("ok", "unavailable", ...)
//   lazyattn_router_ttft_seconds                    arrival at the router to the first token
//                                                   from a worker, requests that succeeded
//   lazyattn_router_request_duration_seconds        arrival to the end, requests that succeeded
//   lazyattn_router_in_flight_requests              requests admitted and not yet ended
//   lazyattn_router_workers_healthy                 workers health probing admits (the ones the
//                                                   router would route to), after each probe round
//   lazyattn_router_routing_duration_seconds        arrival to worker choice (kvdir lookup
//   included) lazyattn_router_predicted_hit_tokens_total      predicted cached tokens on the chosen
//   workers lazyattn_router_retries_total                   attempts beyond the first (failover)
//   lazyattn_router_worker_selections_total{worker} attempts sent to each worker
//   lazyattn_router_worker_ejections_total          workers ejected by health probing
//   lazyattn_router_first_token_timeouts_total      attempts cancelled without a first token
//   lazyattn_router_quarantined_requests_total      requests ended FAILED_PRECONDITION by the
//                                                   query-of-death quarantine (the one whose
//                                                   second lost worker quarantined it, and every
//                                                   later one refused)
//   lazyattn_router_worker_connection_losses_total  attempts whose worker connection was lost
//                                                   mid-call (the worker process died)
//   lazyattn_router_observed_hit_tokens_total       document tokens the serving workers reported
//                                                   reused (Usage.document_hit_tokens), requests
//                                                   routed with documents that succeeded
//   lazyattn_router_prediction_error_tokens         |predicted - observed| hit tokens per such
//                                                   request (docs/router.md, "Predictions")
//   lazyattn_router_invalid_utf8_requests_total{field}  requests refused because a text field
//                                                   ("system", "documents.text", ...) is not UTF-8
#ifndef LAZYATTN_SERVICES_ROUTER_SERVER_ROUTER_METRICS_H_
#define LAZYATTN_SERVICES_ROUTER_SERVER_ROUTER_METRICS_H_

#include <grpcpp/support/status.h>
#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <array>
#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace lazyattn::router {

// "ok", "invalid_argument", ... (the label value of a status code).
const char* StatusCodeLabel(grpc::StatusCode code);

class RouterMetrics {
 public:
  RouterMetrics(prometheus::Registry& registry, const std::string& policy);

  void CountRequest(grpc::StatusCode code);
  void ObserveRouting(absl::Duration d) { routing_->Observe(absl::ToDoubleSeconds(d)); }
  void AddPredictedHitTokens(int64_t tokens) {
    if (tokens > 0) predicted_hits_->Increment(static_cast<double>(tokens));
  }
  // A request routed with documents succeeded: what was predicted for its worker and what the
  // worker reported it reused.
  void ObservePrediction(int64_t predicted, int64_t observed) {
    if (observed > 0) observed_hits_->Increment(static_cast<double>(observed));
    prediction_error_->Observe(static_cast<double>(predicted > observed ? predicted - observed
                                                                        : observed - predicted));
  }
  void CountRetry() { retries_->Increment(); }
  void ObserveTtft(absl::Duration d) { ttft_->Observe(absl::ToDoubleSeconds(d)); }
  void ObserveDuration(absl::Duration d) { duration_->Observe(absl::ToDoubleSeconds(d)); }
  void AddInFlight(int delta) { in_flight_->Increment(delta); }
  void SetWorkersHealthy(int n) { workers_healthy_->Set(n); }
  void CountEjection() { ejections_->Increment(); }
  void CountFirstTokenTimeout() { first_token_timeouts_->Increment(); }
  void CountQuarantined() { quarantined_->Increment(); }
  void CountConnectionLoss() { connection_losses_->Increment(); }
  void CountSelection(const std::string& worker);
  // Counts a validation failure that is a text field not in UTF-8 (RequestValidator's label);
  // any other status is ignored.
  void CountValidationFailure(const absl::Status& status);

 private:
  static constexpr int kCodes = 17;  // grpc::StatusCode OK .. UNAUTHENTICATED
  std::array<prometheus::Counter*, kCodes> requests_{};
  prometheus::Histogram* routing_;
  prometheus::Histogram* ttft_;
  prometheus::Histogram* duration_;
  prometheus::Gauge* in_flight_;
  prometheus::Gauge* workers_healthy_;
  prometheus::Counter* predicted_hits_;
  prometheus::Counter* observed_hits_;
  prometheus::Histogram* prediction_error_;
  prometheus::Counter* retries_;
  prometheus::Counter* ejections_;
  prometheus::Counter* first_token_timeouts_;
  prometheus::Counter* quarantined_;
  prometheus::Counter* connection_losses_;
  prometheus::Family<prometheus::Counter>* selections_family_;
  absl::flat_hash_map<std::string, prometheus::Counter*> invalid_utf8_;  // built once, by label
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, prometheus::Counter*> selections_ ABSL_GUARDED_BY(mu_);
};

}  // namespace lazyattn::router

#endif  // LAZYATTN_SERVICES_ROUTER_SERVER_ROUTER_METRICS_H_
