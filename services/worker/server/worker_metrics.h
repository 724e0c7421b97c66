// The worker's Prometheus metrics. Families and their labelled children are built once here; the
// request path only bumps cached children (CONVENTIONS: never Family::Add per request).
//
// Request-level families carry a constant `model` label (the model file's name). Buckets follow
// vLLM's long tails (TTFT to 2560 s, inter-token to 80 s) with fine steps below 1 s, where SLOs
// live.
//
//   lazyattn_worker_ttft_seconds                        histogram: arrival at the worker to the
//                                                       first generated token
//   lazyattn_worker_inter_token_seconds                 histogram: between consecutive tokens
//   lazyattn_worker_request_duration_seconds            histogram: arrival to the end of a request
//                                                       that finished (end-to-end latency)
//   lazyattn_worker_queue_time_seconds                  histogram: arrival to first admission
//   lazyattn_worker_prefill_time_seconds                histogram: first admission to first token
//   lazyattn_worker_prompt_length_tokens                histogram: prompt tokens of a request
//   lazyattn_worker_generation_length_tokens            histogram: tokens a request generated
//   lazyattn_worker_prompt_tokens_total                 counter: prompt tokens of finished requests
//   lazyattn_worker_generated_tokens_total              counter: generated tokens, all requests
//   lazyattn_worker_finished_requests_total{finish_reason}  counter: "stop", "length"
//   lazyattn_worker_requests_total{status}              counter: Generate requests by final gRPC
//                                                       status ("ok", "invalid_argument", ...)
//   lazyattn_worker_kv_usage_ratio                      gauge 0-1: KV blocks referenced by running
//                                                       requests / all blocks (cached evictable
//                                                       blocks count as free, as vLLM counts them)
//   lazyattn_worker_document_lookup_tokens_total{mode}  counter: document tokens looked up in the
//                                                       document cache (modes block, lazy)
//   lazyattn_worker_document_hit_tokens_total{mode}     counter: ... found there. Hit ratio =
//                                                       rate(hit) / rate(lookup), in PromQL
//   lazyattn_worker_prefill_tokens_total{kind}          counter: prompt tokens computed / reused
//   lazyattn_worker_kv_blocks{state}                    gauge: free, referenced (pinned by running
//                                                       requests), cached (evictable)
//   lazyattn_worker_queue_length                        gauge: requests waiting for admission
//   lazyattn_worker_running_requests                    gauge: requests admitted
//   lazyattn_worker_kvdir_connected                     gauge: 1 while the Publish stream is up
//   lazyattn_worker_preemptions_total                  counter: running requests preempted for
//                                                      KV blocks
//   lazyattn_worker_kv_pool_errors_total               counter: inconsistencies found in the KV
//                                                      block pool (a bug; the worker stops serving)
//   lazyattn_worker_step_failures_total                counter: engine steps the runner failed (a
//                                                      device error; see EngineCore)
//   lazyattn_worker_steps_isolated_total               counter: failed steps of several items that
//                                                      then ran one per step (see EngineCore)
//   lazyattn_worker_serving                            gauge: 1 while the worker serves, 0 once it
//                                                      turned itself NOT_SERVING (failed steps, a
//                                                      sticky device error, a broken KV pool) or
//                                                      drains
//   lazyattn_worker_kvdir_events_dropped_total          counter: cache events not sent (queue full
//                                                       or kvdir unreachable; a snapshot follows)
//   lazyattn_worker_invalid_utf8_requests_total{field}  counter: Generate and Prefetch requests
//                                                       refused because a text field ("system",
//                                                       "documents.text", ...) is not UTF-8
//
// Engine counters and gauges are copied in by Refresh() (the engine keeps its own counters; a
// periodic refresh turns their growth into counter increments).
#ifndef LAZYATTN_SERVICES_WORKER_SERVER_WORKER_METRICS_H_
#define LAZYATTN_SERVICES_WORKER_SERVER_WORKER_METRICS_H_

#include <array>
#include <cstdint>
#include <mutex>
#include <string>

#include <grpcpp/support/status.h>
#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "common/request_validator.h"
#include "services/worker/engine/engine.h"

namespace lazyattn {

class WorkerMetrics {
 public:
  // `model` is the value of the constant model label (may be empty).
  explicit WorkerMetrics(prometheus::Registry& registry, const std::string& model = "");

  void ObserveTtft(double seconds) { ttft_->Observe(seconds); }
  // A request that ended: every request's generated tokens are counted; a successful one's
  // duration (arrival to now, `e2e_seconds`), queue and prefill times, lengths and finish reason
  // are observed too.
  void ObserveFinished(bool ok, const RequestResult& result, double e2e_seconds);
  void ObserveInterToken(double seconds) { inter_token_->Observe(seconds); }
  void CountRequest(grpc::StatusCode code);
  // Counts a validation failure that is a text field not in UTF-8 (the validator's field label);
  // any other status is ignored.
  void CountValidationFailure(const absl::Status& status);

  struct PublisherCounts {
    bool connected = false;
    int64_t events_dropped = 0;  // monotonic
  };
  // 1 while serving, 0 once NOT_SERVING (never 1 again in this process).
  void SetServing(bool serving) { serving_->Set(serving ? 1 : 0); }
  // Thread-safe; counters advance by the growth since the previous call.
  void Refresh(const EngineStats& stats, const KvBlockCounts& blocks, const EngineLoad& load,
               const PublisherCounts& publisher);

 private:
  // Built once in the constructor; owned by the registry.
  prometheus::Histogram* ttft_ = nullptr;
  prometheus::Histogram* inter_token_ = nullptr;
  prometheus::Histogram* duration_ = nullptr;
  prometheus::Histogram* queue_time_ = nullptr;
  prometheus::Histogram* prefill_time_ = nullptr;
  prometheus::Histogram* prompt_length_ = nullptr;
  prometheus::Histogram* generation_length_ = nullptr;
  prometheus::Counter* prompt_tokens_ = nullptr;
  prometheus::Counter* generated_tokens_ = nullptr;
  prometheus::Counter* finished_stop_ = nullptr;
  prometheus::Counter* finished_length_ = nullptr;
  prometheus::Counter* finished_other_ = nullptr;
  prometheus::Gauge* kv_usage_ = nullptr;
  std::array<prometheus::Counter*, 17> requests_{};      // by grpc::StatusCode (0..16)
  std::array<prometheus::Counter*, 4> lookup_tokens_{};  // by CacheMode
  std::array<prometheus::Counter*, 4> hit_tokens_{};
  prometheus::Counter* prefill_computed_ = nullptr;
  prometheus::Counter* prefill_reused_ = nullptr;
  prometheus::Gauge* blocks_free_ = nullptr;
  prometheus::Gauge* blocks_referenced_ = nullptr;
  prometheus::Gauge* blocks_cached_ = nullptr;
  prometheus::Gauge* queue_length_ = nullptr;
  prometheus::Gauge* running_ = nullptr;
  prometheus::Gauge* kvdir_connected_ = nullptr;
  prometheus::Counter* kvdir_events_dropped_ = nullptr;
  prometheus::Counter* pool_errors_ = nullptr;
  prometheus::Counter* preemptions_ = nullptr;
  prometheus::Counter* step_failures_ = nullptr;
  prometheus::Counter* steps_isolated_ = nullptr;
  prometheus::Gauge* serving_ = nullptr;
  prometheus::Counter* text_docs_tokenized_ = nullptr;
  prometheus::Counter* text_docs_reused_ = nullptr;
  prometheus::Counter* id_docs_hashed_ = nullptr;
  prometheus::Counter* id_docs_reused_ = nullptr;
  std::array<prometheus::Counter*, kTextFieldLabels.size()> invalid_utf8_{};  // by kTextFieldLabels

  std::mutex mu_;
  EngineStats last_stats_ ABSL_GUARDED_BY(mu_);
  int64_t last_dropped_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace lazyattn

#endif  // LAZYATTN_SERVICES_WORKER_SERVER_WORKER_METRICS_H_
