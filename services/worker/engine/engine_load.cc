// What the engine reports as its load (EngineCore::Load, PublishedLoad): the counts the
// admission bound uses and the queued prefill the router routes by.
#include "absl/container/flat_hash_set.h"
#include "services/worker/engine/engine_core_state.h"

namespace lazyattn {

EngineLoad EngineCore::PublishedLoad(absl::Time now) {
  // (A clock stepped back past the last estimate recomputes too, or the estimate would freeze.)
  if (waiting_.size() <= static_cast<size_t>(kExactLoadWaiting) || now >= next_prefill_estimate_ ||
      now < next_prefill_estimate_ - kLoadEstimateInterval) {
    const EngineLoad load = Load();
    published_prefill_tokens_ = load.queued_prefill_tokens;
    next_prefill_estimate_ = now + kLoadEstimateInterval;
    return load;
  }
  EngineLoad load;
  load.running = static_cast<int>(running_.size());
  load.waiting = static_cast<int>(waiting_.size());
  for (RequestId id : waiting_) {
    const Request& r = *requests_.at(id);
    load.waiting_tokens +=
        r.prepared.prompt_tokens() + static_cast<int64_t>(r.result.token_ids.size());
  }
  load.queued_prefill_tokens = published_prefill_tokens_;
  return load;
}

EngineLoad EngineCore::Load() const {
  EngineLoad load;
  load.running = static_cast<int>(running_.size());
  load.waiting = static_cast<int>(waiting_.size());
  // A waiting request's documents the cache holds (a block-mode request also copies an entry
  // computed at another offset, or a position-free one, rather than encoding), or that a job
  // encodes, or that an earlier waiting request counted, are not work it adds: the worker holding
  // the hot set must not look busiest.
  absl::flat_hash_set<DocCacheKey> counted;
  const DocumentCache& documents = cache_.documents();
  auto reused = [&](const DocCacheKey& key, int64_t /*tokens*/) {
    return documents.Contains(key) ||
           (key.offset != DocCacheKey::kAnyOffset && documents.HasCopySource(key.doc)) ||
           job_by_key_.contains(key) || !counted.insert(key).second;
  };
  for (RequestId id : waiting_) {
    const Request& r = *requests_.at(id);
    const int64_t generated = static_cast<int64_t>(r.result.token_ids.size());
    load.queued_prefill_tokens += PrefillTokensToCompute(r.prepared, reused) + generated;
    load.waiting_tokens += r.prepared.prompt_tokens() + generated;
  }
  for (RequestId id : running_) {
    const Request& r = *requests_.at(id);
    if (r.phase != Request::Phase::kPrefill) continue;
    for (const Segment& s : r.segments) {
      if (s.job == 0) load.queued_prefill_tokens += s.length() - s.ready;
    }
  }
  for (const auto& [id, job] : jobs_) load.queued_prefill_tokens += job->length() - job->ready;
  return load;
}

}  // namespace lazyattn
