#include "services/router/server/router_metrics.h"

#include "common/log.h"
#include "common/request_validator.h"

namespace lazyattn::router {

const char* StatusCodeLabel(grpc::StatusCode code) { return StatusCodeName(static_cast<int>(code)); }

RouterMetrics::RouterMetrics(prometheus::Registry& registry, const std::string& policy) {
  auto& requests = prometheus::BuildCounter()
                       .Name("lazyattn_router_requests_total")
                       .Help("Generate and Complete requests by routing policy and final status")
                       .Register(registry);
  for (int c = 0; c < kCodes; ++c) {
    requests_[c] = &requests.Add({{"policy", policy}, {"status", StatusCodeName(c)}});
  }
  routing_ = &prometheus::BuildHistogram()
                  .Name("lazyattn_router_routing_duration_seconds")
                  .Help(
                      "Time from request arrival to the choice of a worker (kvdir lookup "
                      "included)")
                  .Register(registry)
                  .Add({}, prometheus::Histogram::BucketBoundaries{0.00005, 0.0001, 0.00025, 0.0005,
                                                                   0.001, 0.0025, 0.005, 0.01,
                                                                   0.025, 0.05, 0.1, 0.25});
  // The workers' buckets (vLLM's long tails, fine below 1 s): the same SLO reads at both ends.
  ttft_ = &prometheus::BuildHistogram()
               .Name("lazyattn_router_ttft_seconds")
               .Help("Time from a request's arrival at the router to its first token (requests "
                     "that succeeded; retries included)")
               .Register(registry)
               .Add({}, prometheus::Histogram::BucketBoundaries{
                            0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.25,
                            0.3, 0.4, 0.5, 0.75, 1, 1.5, 2, 2.5, 5, 7.5, 10, 20, 40, 80, 160,
                            640, 2560});
  duration_ = &prometheus::BuildHistogram()
                   .Name("lazyattn_router_request_duration_seconds")
                   .Help("Time from a request's arrival at the router to its end (requests that "
                         "succeeded)")
                   .Register(registry)
                   .Add({}, prometheus::Histogram::BucketBoundaries{
                                0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.3, 0.5, 0.8, 1, 1.5, 2,
                                2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240, 480, 960, 1920,
                                7680});
  in_flight_ = &prometheus::BuildGauge()
                    .Name("lazyattn_router_in_flight_requests")
                    .Help("Requests admitted by the router and not yet ended")
                    .Register(registry)
                    .Add({});
  workers_healthy_ = &prometheus::BuildGauge()
                          .Name("lazyattn_router_workers_healthy")
                          .Help("Workers that health probing admits: the ones the router would "
                                "route to now")
                          .Register(registry)
                          .Add({});
  predicted_hits_ = &prometheus::BuildCounter()
                         .Name("lazyattn_router_predicted_hit_tokens_total")
                         .Help("Document tokens predicted to be cached on the chosen workers")
                         .Register(registry)
                         .Add({});
  observed_hits_ = &prometheus::BuildCounter()
                        .Name("lazyattn_router_observed_hit_tokens_total")
                        .Help("Document tokens the serving workers reported reused (requests "
                              "routed with documents that succeeded)")
                        .Register(registry)
                        .Add({});
  // Exact predictions land in the first bucket; a missed document costs its length.
  prediction_error_ = &prometheus::BuildHistogram()
                           .Name("lazyattn_router_prediction_error_tokens")
                           .Help("|predicted - observed| document hit tokens per request routed "
                                 "with documents that succeeded")
                           .Register(registry)
                           .Add({}, prometheus::Histogram::BucketBoundaries{
                                        0, 16, 64, 256, 1024, 4096, 16384, 65536, 262144});
  retries_ = &prometheus::BuildCounter()
                  .Name("lazyattn_router_retries_total")
                  .Help("Requests sent to another worker after a failure before the first token")
                  .Register(registry)
                  .Add({});
  ejections_ = &prometheus::BuildCounter()
                    .Name("lazyattn_router_worker_ejections_total")
                    .Help("Workers taken out of routing by health probing (NOT_SERVING or "
                          "consecutive failed probes)")
                    .Register(registry)
                    .Add({});
  first_token_timeouts_ = &prometheus::BuildCounter()
                               .Name("lazyattn_router_first_token_timeouts_total")
                               .Help("Attempts cancelled for sending no token within "
                                     "routing.first_token_timeout_ms")
                               .Register(registry)
                               .Add({});
  quarantined_ = &prometheus::BuildCounter()
                      .Name("lazyattn_router_quarantined_requests_total")
                      .Help("Requests refused (FAILED_PRECONDITION) because their content lost "
                            "two workers' connections mid-call (query-of-death quarantine)")
                      .Register(registry)
                      .Add({});
  connection_losses_ = &prometheus::BuildCounter()
                            .Name("lazyattn_router_worker_connection_losses_total")
                            .Help("Attempts whose worker connection was lost mid-call (the "
                                  "worker process died holding the request)")
                            .Register(registry)
                            .Add({});
  selections_family_ = &prometheus::BuildCounter()
                            .Name("lazyattn_router_worker_selections_total")
                            .Help("Attempts sent to each worker")
                            .Register(registry);
  auto& utf8 = prometheus::BuildCounter()
                   .Name("lazyattn_router_invalid_utf8_requests_total")
                   .Help("Requests refused because a text field is not valid UTF-8, by field")
                   .Register(registry);
  for (const char* field : kTextFieldLabels) invalid_utf8_[field] = &utf8.Add({{"field", field}});
}

void RouterMetrics::CountValidationFailure(const absl::Status& status) {
  const std::optional<std::string> field = InvalidUtf8FieldLabel(status);
  if (!field.has_value()) return;
  auto it = invalid_utf8_.find(*field);
  if (it != invalid_utf8_.end()) it->second->Increment();
}

void RouterMetrics::CountRequest(grpc::StatusCode code) {
  const int c = static_cast<int>(code);
  requests_[(c >= 0 && c < kCodes) ? c : static_cast<int>(grpc::StatusCode::UNKNOWN)]->Increment();
}

void RouterMetrics::CountSelection(const std::string& worker) {
  prometheus::Counter* counter;
  {
    absl::MutexLock lock(&mu_);
    auto it = selections_.find(worker);
    if (it == selections_.end()) {
      it = selections_.emplace(worker, &selections_family_->Add({{"worker", worker}})).first;
    }
    counter = it->second;
  }
  counter->Increment();
}

}  // namespace lazyattn::router
