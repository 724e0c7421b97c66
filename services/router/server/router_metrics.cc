#include "services/router/server/router_metrics.h"

#include <map>
#include <optional>

#include "common/log.h"
#include "common/request_validator.h"

namespace lazyattn::router {

const char* StatusCodeLabel(grpc::StatusCode code) {
  return StatusCodeName(static_cast<int>(code));
}

namespace {

// The workers' buckets (vLLM's long tails, fine below 1 s): the same SLO reads at both ends.
const prometheus::Histogram::BucketBoundaries kTtftBuckets{
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5,
    0.75,  1,     1.5,  2,    2.5,  5,    7.5,  10,  20,   40,  80,   160, 640, 2560};
const prometheus::Histogram::BucketBoundaries kDurationBuckets{
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.3, 0.5, 0.8, 1,   1.5, 2,    2.5, 5,
    10,    15,   20,    30,   40,  50,   60,  120, 240, 480, 960, 1920, 7680};
// Exact predictions land in the first bucket; a missed document costs its length.
const prometheus::Histogram::BucketBoundaries kPredictionErrorBuckets{
    0, 16, 64, 256, 1024, 4096, 16384, 65536, 262144};

}  // namespace

void ModelMetrics::CountRequest(grpc::StatusCode code) {
  const int c = static_cast<int>(code);
  requests_[(c >= 0 && c < kCodes) ? c : static_cast<int>(grpc::StatusCode::UNKNOWN)]->Increment();
}

RouterMetrics::RouterMetrics(prometheus::Registry& registry, const std::string& policy)
    : policy_(policy) {
  requests_family_ = &prometheus::BuildCounter()
                          .Name("lazyattn_router_requests_total")
                          .Help(
                              "Generate and Complete requests by routing policy, final status "
                              "and model")
                          .Register(registry);
  routing_ = &prometheus::BuildHistogram()
                  .Name("lazyattn_router_routing_duration_seconds")
                  .Help(
                      "Time from request arrival to the choice of a worker (kvdir lookup "
                      "included)")
                  .Register(registry)
                  .Add({}, prometheus::Histogram::BucketBoundaries{0.00005, 0.0001, 0.00025, 0.0005,
                                                                   0.001, 0.0025, 0.005, 0.01,
                                                                   0.025, 0.05, 0.1, 0.25});
  ttft_family_ = &prometheus::BuildHistogram()
                      .Name("lazyattn_router_ttft_seconds")
                      .Help(
                          "Time from a request's arrival at the router to its first token "
                          "(every request that got one, whatever its end; retries included; a "
                          "request that succeeded without a token: to its end)")
                      .Register(registry);
  no_first_token_family_ = &prometheus::BuildHistogram()
                                .Name("lazyattn_router_no_first_token_seconds")
                                .Help(
                                    "Time from a request's arrival at the router to its end, for "
                                    "requests that ended without a first token (cancelled by the "
                                    "client, past their deadline, failed)")
                                .Register(registry);
  duration_family_ = &prometheus::BuildHistogram()
                          .Name("lazyattn_router_request_duration_seconds")
                          .Help(
                              "Time from a request's arrival at the router to its end (requests "
                              "that succeeded)")
                          .Register(registry);
  in_flight_ = &prometheus::BuildGauge()
                    .Name("lazyattn_router_in_flight_requests")
                    .Help("Requests admitted by the router and not yet ended")
                    .Register(registry)
                    .Add({});
  workers_healthy_ = &prometheus::BuildGauge()
                          .Name("lazyattn_router_workers_healthy")
                          .Help(
                              "Workers that health probing admits: the ones the router would "
                              "route to now")
                          .Register(registry)
                          .Add({});
  workers_distrusted_ = &prometheus::BuildGauge()
                             .Name("lazyattn_router_workers_distrusted")
                             .Help(
                                 "Workers whose directory claims count at less than in full when "
                                 "ranking: they reused far less than the directory said they "
                                 "hold")
                             .Register(registry)
                             .Add({});
  predicted_hits_family_ = &prometheus::BuildCounter()
                                .Name("lazyattn_router_predicted_hit_tokens_total")
                                .Help(
                                    "Document tokens predicted to be cached on the chosen "
                                    "workers")
                                .Register(registry);
  observed_hits_family_ = &prometheus::BuildCounter()
                               .Name("lazyattn_router_observed_hit_tokens_total")
                               .Help(
                                   "Document tokens the serving workers reported reused "
                                   "(requests routed with documents that succeeded)")
                               .Register(registry);
  prediction_error_family_ = &prometheus::BuildHistogram()
                                  .Name("lazyattn_router_prediction_error_tokens")
                                  .Help(
                                      "|predicted - observed| document hit tokens per request "
                                      "routed with documents that succeeded")
                                  .Register(registry);
  retries_family_ = &prometheus::BuildCounter()
                         .Name("lazyattn_router_retries_total")
                         .Help(
                             "Requests sent to another worker after a failure before the first "
                             "token")
                         .Register(registry);
  retries_refused_family_ = &prometheus::BuildCounter()
                                 .Name("lazyattn_router_retries_refused_total")
                                 .Help(
                                     "Failovers not tried because the retry budget was spent "
                                     "(routing.retry_budget_percent, routing.retry_budget_min)")
                                 .Register(registry);
  ejections_ = &prometheus::BuildCounter()
                    .Name("lazyattn_router_worker_ejections_total")
                    .Help(
                        "Workers taken out of routing by health probing (NOT_SERVING or "
                        "consecutive failed probes)")
                    .Register(registry)
                    .Add({});
  client_write_timeouts_ = &prometheus::BuildCounter()
                                .Name("lazyattn_router_client_write_timeouts_total")
                                .Help(
                                    "gRPC calls (streams, Complete answers) cancelled because "
                                    "their client read nothing for "
                                    "routing.client_write_timeout_ms, or made their writes wait "
                                    "routing.client_write_wait_budget_ms in all")
                                .Register(registry)
                                .Add({});
  skipped_lookups_ = &prometheus::BuildCounter()
                          .Name("lazyattn_router_kvdir_lookups_skipped_total")
                          .Help(
                              "Requests routed by load without a kvdir lookup because lookups "
                              "kept failing (kvdir.lookup_failures_to_skip)")
                          .Register(registry)
                          .Add({});
  first_token_timeouts_family_ = &prometheus::BuildCounter()
                                      .Name("lazyattn_router_first_token_timeouts_total")
                                      .Help(
                                          "Attempts cancelled for sending no token within "
                                          "routing.first_token_timeout_ms, or within "
                                          "routing.first_token_max_wait_ms of their start")
                                      .Register(registry);
  token_idle_timeouts_family_ = &prometheus::BuildCounter()
                                     .Name("lazyattn_router_token_idle_timeouts_total")
                                     .Help(
                                         "Attempts cancelled because their worker sent nothing "
                                         "for routing.token_idle_timeout_ms after the first "
                                         "token (frozen mid-generation)")
                                     .Register(registry);
  prefetch_timeouts_family_ = &prometheus::BuildCounter()
                                   .Name("lazyattn_router_prefetch_timeouts_total")
                                   .Help(
                                       "Prefetch calls to a worker cancelled for no answer "
                                       "within routing.prefetch_timeout_ms")
                                   .Register(registry);
  protocol_errors_family_ = &prometheus::BuildCounter()
                                 .Name("lazyattn_router_worker_protocol_errors_total")
                                 .Help(
                                     "Attempts cancelled because their worker's Generate stream "
                                     "broke the protocol (a token past max_tokens, outside the "
                                     "vocabulary or after the final message)")
                                 .Register(registry);
  quarantined_family_ = &prometheus::BuildCounter()
                             .Name("lazyattn_router_quarantined_requests_total")
                             .Help(
                                 "Requests refused (FAILED_PRECONDITION) because their content "
                                 "lost worker connections mid-call in two crashes (query-of-death "
                                 "quarantine)")
                             .Register(registry);
  connection_losses_family_ = &prometheus::BuildCounter()
                                   .Name("lazyattn_router_worker_connection_losses_total")
                                   .Help(
                                       "Attempts whose worker connection was lost mid-call (the "
                                       "worker process died holding the request)")
                                   .Register(registry);
  selections_family_ = &prometheus::BuildCounter()
                            .Name("lazyattn_router_worker_selections_total")
                            .Help("Attempts sent to each worker, by the request's model")
                            .Register(registry);
  worker_failures_family_ =
      &prometheus::BuildCounter()
           .Name("lazyattn_router_worker_failures_total")
           .Help(
               "Generate and Complete attempts that ended in an error, by worker and gRPC code "
               "(not the client's cancellation or deadline, nor a drain's hand-back)")
           .Register(registry);
  auto& utf8 = prometheus::BuildCounter()
                   .Name("lazyattn_router_invalid_utf8_requests_total")
                   .Help("Requests refused because a text field is not valid UTF-8, by field")
                   .Register(registry);
  for (const char* field : kTextFieldLabels) invalid_utf8_[field] = &utf8.Add({{"field", field}});
  // Every router has these series from its start, so a dashboard shows zeros, not "no data".
  no_model_ = NewModelMetrics(kNoModelLabel);
}

std::unique_ptr<ModelMetrics> RouterMetrics::NewModelMetrics(std::string label) {
  std::unique_ptr<ModelMetrics> m(new ModelMetrics(std::move(label)));
  const std::map<std::string, std::string> labels{{"model", m->label_}};
  for (int c = 0; c < ModelMetrics::kCodes; ++c) {
    m->requests_[c] = &requests_family_->Add(
        {{"policy", policy_}, {"status", StatusCodeName(c)}, {"model", m->label_}});
  }
  m->ttft_ = &ttft_family_->Add(labels, kTtftBuckets);
  m->no_first_token_ = &no_first_token_family_->Add(labels, kTtftBuckets);
  m->duration_ = &duration_family_->Add(labels, kDurationBuckets);
  m->predicted_hits_ = &predicted_hits_family_->Add(labels);
  m->observed_hits_ = &observed_hits_family_->Add(labels);
  m->prediction_error_ = &prediction_error_family_->Add(labels, kPredictionErrorBuckets);
  m->retries_ = &retries_family_->Add(labels);
  m->retries_refused_ = &retries_refused_family_->Add(labels);
  m->first_token_timeouts_ = &first_token_timeouts_family_->Add(labels);
  m->token_idle_timeouts_ = &token_idle_timeouts_family_->Add(labels);
  m->prefetch_timeouts_ = &prefetch_timeouts_family_->Add(labels);
  m->protocol_errors_ = &protocol_errors_family_->Add(labels);
  m->quarantined_ = &quarantined_family_->Add(labels);
  m->connection_losses_ = &connection_losses_family_->Add(labels);
  return m;
}

ModelMetrics& RouterMetrics::ForModel(std::string_view model_id) {
  if (model_id.empty()) return *no_model_;
  absl::MutexLock lock(&mu_);
  // Debian's Abseil keeps its own string_view: the heterogeneous lookup takes that one.
  if (auto it = models_.find(absl::string_view(model_id.data(), model_id.size()));
      it != models_.end()) {
    return *it->second;
  }
  if (models_.size() >= kMaxModelLabels) {
    if (other_model_ == nullptr) other_model_ = NewModelMetrics(kOtherModelLabel);
    return *other_model_;
  }
  std::string id(model_id);
  std::unique_ptr<ModelMetrics> m = NewModelMetrics(id);
  return *models_.emplace(std::move(id), std::move(m)).first->second;
}

void RouterMetrics::CountValidationFailure(const absl::Status& status) {
  const std::optional<std::string> field = InvalidUtf8FieldLabel(status);
  if (!field.has_value()) return;
  auto it = invalid_utf8_.find(*field);
  if (it != invalid_utf8_.end()) it->second->Increment();
}

void RouterMetrics::CountSelection(const std::string& worker, const ModelMetrics& model) {
  prometheus::Counter* counter;
  {
    absl::MutexLock lock(&mu_);
    auto key = std::make_pair(worker, model.label());
    auto it = selections_.find(key);
    if (it == selections_.end()) {
      it = selections_
               .emplace(key,
                        &selections_family_->Add({{"worker", worker}, {"model", model.label()}}))
               .first;
    }
    counter = it->second;
  }
  counter->Increment();
}

void RouterMetrics::CountWorkerFailure(const std::string& worker, const ModelMetrics& model,
                                       grpc::StatusCode code) {
  prometheus::Counter* counter;
  {
    absl::MutexLock lock(&mu_);
    // Codes outside gRPC's 0-16 count as UNKNOWN (their label already is "unknown"): one entry,
    // not one per number a worker sends.
    int known = static_cast<int>(code);
    if (known < 0 || known > static_cast<int>(grpc::StatusCode::UNAUTHENTICATED)) {
      known = static_cast<int>(grpc::StatusCode::UNKNOWN);
    }
    const auto key = std::make_tuple(worker, model.label(), known);
    auto it = worker_failures_.find(key);
    if (it == worker_failures_.end()) {
      it = worker_failures_
               .emplace(key, &worker_failures_family_->Add({{"worker", worker},
                                                            {"model", model.label()},
                                                            {"code", StatusCodeName(known)}}))
               .first;
    }
    counter = it->second;
  }
  counter->Increment();
}

}  // namespace lazyattn::router
