#include "services/worker/server/worker_metrics.h"

#include <string>

#include "common/request_validator.h"

namespace lazyattn {
namespace {

constexpr std::array<const char*, 17> kStatusNames = {
    "ok",        "cancelled",          "unknown",           "invalid_argument",
    "deadline_exceeded", "not_found",  "already_exists",    "permission_denied",
    "resource_exhausted", "failed_precondition", "aborted", "out_of_range",
    "unimplemented", "internal",        "unavailable",       "data_loss",
    "unauthenticated"};

prometheus::Histogram::BucketBoundaries TtftBuckets() {
  return {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};
}
prometheus::Histogram::BucketBoundaries InterTokenBuckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1};
}

void Advance(prometheus::Counter* c, int64_t now, int64_t before) {
  if (now > before) c->Increment(static_cast<double>(now - before));
}

}  // namespace

WorkerMetrics::WorkerMetrics(prometheus::Registry& registry) {
  using prometheus::BuildCounter;
  using prometheus::BuildGauge;
  using prometheus::BuildHistogram;
  ttft_ = &BuildHistogram()
               .Name("lazyattn_worker_ttft_seconds")
               .Help("Time from a request's arrival at the worker to its first token")
               .Register(registry)
               .Add({}, TtftBuckets());
  inter_token_ = &BuildHistogram()
                      .Name("lazyattn_worker_inter_token_seconds")
                      .Help("Time between consecutive generated tokens of a request")
                      .Register(registry)
                      .Add({}, InterTokenBuckets());
  auto& requests = BuildCounter()
                       .Name("lazyattn_worker_requests_total")
                       .Help("Generate requests by final gRPC status")
                       .Register(registry);
  for (size_t i = 0; i < kStatusNames.size(); ++i) {
    requests_[i] = &requests.Add({{"status", kStatusNames[i]}});
  }
  auto& utf8 = BuildCounter()
                   .Name("lazyattn_worker_invalid_utf8_requests_total")
                   .Help("Requests refused because a text field is not valid UTF-8, by field")
                   .Register(registry);
  static_assert(std::tuple_size_v<decltype(invalid_utf8_)> == kTextFieldLabels.size());
  for (size_t i = 0; i < kTextFieldLabels.size(); ++i) {
    invalid_utf8_[i] = &utf8.Add({{"field", kTextFieldLabels[i]}});
  }
  auto& lookups = BuildCounter()
                      .Name("lazyattn_worker_document_lookup_tokens_total")
                      .Help("Document tokens looked up in the document cache")
                      .Register(registry);
  auto& hits = BuildCounter()
                   .Name("lazyattn_worker_document_hit_tokens_total")
                   .Help("Document tokens found in the document cache")
                   .Register(registry);
  for (CacheMode m : {CacheMode::kFull, CacheMode::kPrefix, CacheMode::kBlock, CacheMode::kLazy}) {
    const std::string mode(CacheModeName(m));
    lookup_tokens_[static_cast<int>(m)] = &lookups.Add({{"mode", mode}});
    hit_tokens_[static_cast<int>(m)] = &hits.Add({{"mode", mode}});
  }
  auto& prefill = BuildCounter()
                      .Name("lazyattn_worker_prefill_tokens_total")
                      .Help("Prompt tokens computed, or whose KV was reused from a cache")
                      .Register(registry);
  prefill_computed_ = &prefill.Add({{"kind", "computed"}});
  prefill_reused_ = &prefill.Add({{"kind", "reused"}});
  auto& blocks = BuildGauge()
                     .Name("lazyattn_worker_kv_blocks")
                     .Help("KV cache blocks: free, referenced by running requests, cached and "
                           "evictable")
                     .Register(registry);
  blocks_free_ = &blocks.Add({{"state", "free"}});
  blocks_referenced_ = &blocks.Add({{"state", "referenced"}});
  blocks_cached_ = &blocks.Add({{"state", "cached"}});
  queue_length_ = &BuildGauge()
                       .Name("lazyattn_worker_queue_length")
                       .Help("Requests waiting for admission into the running batch")
                       .Register(registry)
                       .Add({});
  running_ = &BuildGauge()
                  .Name("lazyattn_worker_running_requests")
                  .Help("Requests admitted into the running batch")
                  .Register(registry)
                  .Add({});
  kvdir_connected_ = &BuildGauge()
                          .Name("lazyattn_worker_kvdir_connected")
                          .Help("1 while the worker's Publish stream to kvdir is up")
                          .Register(registry)
                          .Add({});
  auto& prep = BuildCounter()
                   .Name("lazyattn_worker_document_prep_total")
                   .Help("Documents prepared at submission: text tokenized or its ids reused "
                         "(token cache), token ids hashed or their key reused (key memo)")
                   .Register(registry);
  text_docs_tokenized_ = &prep.Add({{"document", "text"}, {"result", "computed"}});
  text_docs_reused_ = &prep.Add({{"document", "text"}, {"result", "reused"}});
  id_docs_hashed_ = &prep.Add({{"document", "token_ids"}, {"result", "computed"}});
  id_docs_reused_ = &prep.Add({{"document", "token_ids"}, {"result", "reused"}});
  kvdir_events_dropped_ = &BuildCounter()
                               .Name("lazyattn_worker_kvdir_events_dropped_total")
                               .Help("Cache events not sent to kvdir (a snapshot replaced them)")
                               .Register(registry)
                               .Add({});
  preemptions_ = &BuildCounter()
                      .Name("lazyattn_worker_preemptions_total")
                      .Help("Running requests preempted (their KV blocks released, recomputed "
                            "later) because the KV cache ran out of blocks")
                      .Register(registry)
                      .Add({});
  pool_errors_ = &BuildCounter()
                      .Name("lazyattn_worker_kv_pool_errors_total")
                      .Help("Inconsistencies found in the KV block pool: a bug; the worker then "
                            "stops serving and reports NOT_SERVING")
                      .Register(registry)
                      .Add({});
}

void WorkerMetrics::CountValidationFailure(const absl::Status& status) {
  const std::optional<std::string> field = InvalidUtf8FieldLabel(status);
  if (!field.has_value()) return;
  for (size_t i = 0; i < kTextFieldLabels.size(); ++i) {
    if (*field == kTextFieldLabels[i]) invalid_utf8_[i]->Increment();
  }
}

void WorkerMetrics::CountRequest(grpc::StatusCode code) {
  const int i = static_cast<int>(code);
  requests_[i >= 0 && i < static_cast<int>(requests_.size()) ? i : grpc::StatusCode::UNKNOWN]
      ->Increment();
}

void WorkerMetrics::Refresh(const EngineStats& stats, const KvBlockCounts& blocks,
                            const EngineLoad& load, const PublisherCounts& publisher) {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t computed = 0, reused = 0, computed_before = 0, reused_before = 0;
  for (size_t m = 0; m < stats.by_mode.size(); ++m) {
    const ModeCounters& now = stats.by_mode[m];
    const ModeCounters& before = last_stats_.by_mode[m];
    Advance(lookup_tokens_[m], now.doc_lookup_tokens, before.doc_lookup_tokens);
    Advance(hit_tokens_[m], now.doc_hit_tokens, before.doc_hit_tokens);
    computed += now.prefill_tokens_computed;
    reused += now.prefill_tokens_reused;
    computed_before += before.prefill_tokens_computed;
    reused_before += before.prefill_tokens_reused;
  }
  Advance(prefill_computed_, computed, computed_before);
  Advance(prefill_reused_, reused, reused_before);
  Advance(text_docs_tokenized_, stats.text_docs_tokenized, last_stats_.text_docs_tokenized);
  Advance(text_docs_reused_, stats.text_docs_reused, last_stats_.text_docs_reused);
  Advance(id_docs_hashed_, stats.id_docs_hashed, last_stats_.id_docs_hashed);
  Advance(id_docs_reused_, stats.id_docs_reused, last_stats_.id_docs_reused);
  Advance(pool_errors_, stats.pool_errors, last_stats_.pool_errors);
  Advance(preemptions_, stats.preemptions, last_stats_.preemptions);
  last_stats_ = stats;
  blocks_free_->Set(static_cast<double>(blocks.free));
  blocks_referenced_->Set(static_cast<double>(blocks.referenced));
  blocks_cached_->Set(static_cast<double>(blocks.cached));
  queue_length_->Set(load.waiting);
  running_->Set(load.running);
  kvdir_connected_->Set(publisher.connected ? 1 : 0);
  Advance(kvdir_events_dropped_, publisher.events_dropped, last_dropped_);
  last_dropped_ = publisher.events_dropped;
}

}  // namespace lazyattn
