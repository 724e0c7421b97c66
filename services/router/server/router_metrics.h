// The router's Prometheus metrics (names per CONVENTIONS). Families are built once here; labelled
// children are created up front (status codes), or once per model and per (worker, model) and
// cached, never per request.
//
// Per request, by `model` (ModelMetrics below):
//   lazyattn_router_requests_total{policy,status,model}  Generate and Complete requests by final
//                                                   gRPC status ("ok", "unavailable", ...)
//   lazyattn_router_ttft_seconds{model}             arrival at the router to the first token
//   lazyattn_router_no_first_token_seconds{model}   arrival to the end, ended without a first token
//                                                   from a worker, requests that succeeded
//   lazyattn_router_request_duration_seconds{model} arrival to the end, requests that succeeded
//   lazyattn_router_predicted_hit_tokens_total{model}  predicted cached tokens on the chosen
//                                                   workers (first attempts)
//   lazyattn_router_observed_hit_tokens_total{model}   document tokens the serving workers
//                                                   reported reused (Usage.document_hit_tokens),
//                                                   requests routed with documents that succeeded
//   lazyattn_router_prediction_error_tokens{model}  |predicted - observed| hit tokens per such
//                                                   request (docs/router.md, "Predictions")
//   lazyattn_router_retries_total{model}            attempts beyond the first (failover; Prefetch
//                                                   replacements too)
//   lazyattn_router_retries_refused_total{model}    failovers not tried because the retry budget
//                                                   was spent (retry_budget.h)
//   lazyattn_router_first_token_timeouts_total{model}  attempts cancelled without a first token
//   lazyattn_router_token_idle_timeouts_total{model}  attempts cancelled for a stall after their
//                                                   first token (routing.token_idle_timeout_ms)
//   lazyattn_router_prefetch_timeouts_total{model}  Prefetch calls to a worker cancelled with no
//                                                   answer (routing.prefetch_timeout_ms)
//   lazyattn_router_worker_protocol_errors_total{model}  attempts cancelled because their worker
//                                                   broke the Generate stream's grammar
//                                                   (worker_stream_check.h)
//   lazyattn_router_quarantined_requests_total{model}  requests ended FAILED_PRECONDITION by the
//                                                   query-of-death quarantine (the one whose
//                                                   second lost worker quarantined it, and every
//                                                   later one refused)
//   lazyattn_router_worker_connection_losses_total{model}  attempts whose worker connection was
//                                                   lost mid-call (the worker process died)
//   lazyattn_router_worker_selections_total{worker,model}  attempts sent to each worker
//                                                   (Generate, Complete and Prefetch)
//   lazyattn_router_worker_failures_total{worker,model,code}  Generate and Complete attempts that
//                                                   ended in an error, by worker, the request's
//                                                   model and gRPC code (not the
//                                                   client's cancellation or deadline, nor a
//                                                   drain's hand-back): one worker refusing what
//                                                   the others serve stands out
// For the router:
//   lazyattn_router_in_flight_requests              requests admitted and not yet ended
//   lazyattn_router_workers_healthy                 workers health probing admits (the ones the
//                                                   router would route to), after each probe round
//   lazyattn_router_routing_duration_seconds        arrival to worker choice (kvdir lookup
//                                                   included)
//   lazyattn_router_worker_ejections_total          workers ejected by health probing
//   lazyattn_router_workers_distrusted              workers whose directory claims count at less
//                                                   than in full: they reused far less than
//                                                   claimed (claim_credit.h)
//   lazyattn_router_client_write_timeouts_total     calls cancelled because their client read
//                                                   nothing for routing.client_write_timeout_ms,
//                                                   or made their writes wait
//                                                   routing.client_write_wait_budget_ms in all
//   lazyattn_router_kvdir_lookups_skipped_total     requests routed by load without a kvdir
//                                                   lookup because lookups kept failing
//                                                   (LookupGate, kvdir.lookup_failures_to_skip)
//   lazyattn_router_invalid_utf8_requests_total{field}  requests refused because a text field
//                                                   ("system", "documents.text", ...) is not UTF-8
//
// The `model` label is the id of the model the request was routed to (ModelGroup::id: what
// GET /v1/models lists at that time, model_groups.h), never the client's text: a request refused
// before its model is chosen (validation, admission, an unknown or ambiguous `model`) or routed
// while no worker reports a model counts under kNoModelLabel. The ids come from the workers'
// reports, and past kMaxModelLabels distinct ids (a long life of upgrades) later ones share
// kOtherModelLabel, so the number of series stays bounded whatever clients or workers send. (A
// model whose id is "none" or "other" shares those series.)
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
#include <memory>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace lazyattn::router {

// "ok", "invalid_argument", ... (the label value of a status code).
const char* StatusCodeLabel(grpc::StatusCode code);

// The `model` label of requests no model was chosen for (see above).
inline constexpr char kNoModelLabel[] = "none";
// The `model` label shared by every model id after the first kMaxModelLabels.
inline constexpr char kOtherModelLabel[] = "other";
inline constexpr size_t kMaxModelLabels = 32;

// The per-request families' children for one `model` label value, all created together the
// first time the value is used and kept (at a stable address) for the RouterMetrics' life.
// Thread-safe: prometheus-cpp's children are.
class ModelMetrics {
 public:
  const std::string& label() const { return label_; }

  void CountRequest(grpc::StatusCode code);
  void ObserveTtft(absl::Duration d) { ttft_->Observe(absl::ToDoubleSeconds(d)); }
  // A request that ended without a first token (its client cancelled or its deadline passed
  // first, or it failed): how long it had waited. The TTFT objective counts those that waited
  // past its threshold as slow (deploy/prometheus/rules/slo.yml).
  void ObserveNoFirstToken(absl::Duration d) { no_first_token_->Observe(absl::ToDoubleSeconds(d)); }
  void ObserveDuration(absl::Duration d) { duration_->Observe(absl::ToDoubleSeconds(d)); }
  void AddPredictedHitTokens(int64_t tokens) {
    if (tokens > 0) predicted_hits_->Increment(static_cast<double>(tokens));
  }
  // A request routed with documents succeeded: what was predicted for its worker and what the
  // worker reported it reused.
  void ObservePrediction(int64_t predicted, int64_t observed) {
    if (observed > 0) observed_hits_->Increment(static_cast<double>(observed));
    prediction_error_->Observe(
        static_cast<double>(predicted > observed ? predicted - observed : observed - predicted));
  }
  void CountRetry() { retries_->Increment(); }
  void CountRetryRefused() { retries_refused_->Increment(); }
  void CountFirstTokenTimeout() { first_token_timeouts_->Increment(); }
  void CountTokenIdleTimeout() { token_idle_timeouts_->Increment(); }
  void CountPrefetchTimeout() { prefetch_timeouts_->Increment(); }
  void CountWorkerProtocolError() { protocol_errors_->Increment(); }
  void CountQuarantined() { quarantined_->Increment(); }
  void CountConnectionLoss() { connection_losses_->Increment(); }

 private:
  friend class RouterMetrics;
  explicit ModelMetrics(std::string label) : label_(std::move(label)) {}

  static constexpr int kCodes = 17;  // grpc::StatusCode OK .. UNAUTHENTICATED
  const std::string label_;
  std::array<prometheus::Counter*, kCodes> requests_{};
  prometheus::Histogram* ttft_ = nullptr;
  prometheus::Histogram* no_first_token_ = nullptr;
  prometheus::Histogram* duration_ = nullptr;
  prometheus::Counter* predicted_hits_ = nullptr;
  prometheus::Counter* observed_hits_ = nullptr;
  prometheus::Histogram* prediction_error_ = nullptr;
  prometheus::Counter* retries_ = nullptr;
  prometheus::Counter* retries_refused_ = nullptr;
  prometheus::Counter* first_token_timeouts_ = nullptr;
  prometheus::Counter* token_idle_timeouts_ = nullptr;
  prometheus::Counter* prefetch_timeouts_ = nullptr;
  prometheus::Counter* protocol_errors_ = nullptr;
  prometheus::Counter* quarantined_ = nullptr;
  prometheus::Counter* connection_losses_ = nullptr;
};

class RouterMetrics {
 public:
  RouterMetrics(prometheus::Registry& registry, const std::string& policy);

  // The children of the model whose id is `model_id` (ModelGroup::id of the chosen model);
  // empty: NoModel(). Creates them on the first use of an id (kOtherModelLabel's once
  // kMaxModelLabels ids have been seen); a map lookup under a lock afterwards, so callers look
  // up once per request and keep the reference.
  ModelMetrics& ForModel(std::string_view model_id);
  // Requests no model was chosen for; created with the RouterMetrics.
  ModelMetrics& NoModel() { return *no_model_; }

  // A request refused before its model was chosen (admission): NoModel().CountRequest.
  void CountRequest(grpc::StatusCode code) { no_model_->CountRequest(code); }
  void ObserveRouting(absl::Duration d) { routing_->Observe(absl::ToDoubleSeconds(d)); }
  void AddInFlight(int delta) { in_flight_->Increment(delta); }
  void SetWorkersHealthy(int n) { workers_healthy_->Set(n); }
  void CountEjection() { ejections_->Increment(); }
  void SetWorkersDistrusted(int64_t n) { workers_distrusted_->Set(static_cast<double>(n)); }
  void CountSkippedLookup() { skipped_lookups_->Increment(); }
  void CountClientWriteTimeout() { client_write_timeouts_->Increment(); }
  // An attempt sent to `worker` for a request of `model`.
  void CountSelection(const std::string& worker, const ModelMetrics& model);
  // A Generate or Complete attempt on `worker` that ended with `code` (not OK), as judged by the
  // router: its timeouts and protocol checks included, the client's own ends not.
  void CountWorkerFailure(const std::string& worker, const ModelMetrics& model,
                          grpc::StatusCode code);
  // Counts a validation failure that is a text field not in UTF-8 (RequestValidator's label);
  // any other status is ignored.
  void CountValidationFailure(const absl::Status& status);

 private:
  // Creates `label`'s children in every per-model family.
  std::unique_ptr<ModelMetrics> NewModelMetrics(std::string label);

  const std::string policy_;
  prometheus::Family<prometheus::Counter>* requests_family_;
  prometheus::Family<prometheus::Histogram>* ttft_family_;
  prometheus::Family<prometheus::Histogram>* no_first_token_family_;
  prometheus::Family<prometheus::Histogram>* duration_family_;
  prometheus::Family<prometheus::Counter>* predicted_hits_family_;
  prometheus::Family<prometheus::Counter>* observed_hits_family_;
  prometheus::Family<prometheus::Histogram>* prediction_error_family_;
  prometheus::Family<prometheus::Counter>* retries_family_;
  prometheus::Family<prometheus::Counter>* retries_refused_family_;
  prometheus::Family<prometheus::Counter>* first_token_timeouts_family_;
  prometheus::Family<prometheus::Counter>* token_idle_timeouts_family_;
  prometheus::Family<prometheus::Counter>* prefetch_timeouts_family_;
  prometheus::Family<prometheus::Counter>* protocol_errors_family_;
  prometheus::Family<prometheus::Counter>* quarantined_family_;
  prometheus::Family<prometheus::Counter>* connection_losses_family_;
  prometheus::Family<prometheus::Counter>* selections_family_;
  prometheus::Family<prometheus::Counter>* worker_failures_family_;
  prometheus::Histogram* routing_;
  prometheus::Gauge* in_flight_;
  prometheus::Gauge* workers_healthy_;
  prometheus::Counter* ejections_;
  prometheus::Gauge* workers_distrusted_;
  prometheus::Counter* skipped_lookups_;
  prometheus::Counter* client_write_timeouts_;
  absl::flat_hash_map<std::string, prometheus::Counter*> invalid_utf8_;  // built once, by label
  std::unique_ptr<ModelMetrics> no_model_;

  absl::Mutex mu_;
  // By model id, at most kMaxModelLabels of them.
  absl::flat_hash_map<std::string, std::unique_ptr<ModelMetrics>> models_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<ModelMetrics> other_model_ ABSL_GUARDED_BY(mu_);  // made when first needed
  // By (worker, model label).
  absl::flat_hash_map<std::pair<std::string, std::string>, prometheus::Counter*> selections_
      ABSL_GUARDED_BY(mu_);
  // By (worker, model label, gRPC code).
  absl::flat_hash_map<std::tuple<std::string, std::string, int>, prometheus::Counter*>
      worker_failures_ ABSL_GUARDED_BY(mu_);
};

}  // namespace lazyattn::router

#endif  // LAZYATTN_SERVICES_ROUTER_SERVER_ROUTER_METRICS_H_
