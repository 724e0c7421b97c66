// The engine's signs of life for requests before their first token (RequestCallbacks'
// on_prefill_progress and on_queued): a router restarts its first-token timeout on each, so a
// long prompt or a long queue is not mistaken for a frozen worker.
#include <algorithm>

#include "services/worker/engine/engine_core.h"
#include "services/worker/engine/engine_core_state.h"

namespace lazyattn {

void EngineCore::ReportPrefillProgress(std::vector<RequestId>& requests) {
  std::sort(requests.begin(), requests.end());
  requests.erase(std::unique(requests.begin(), requests.end()), requests.end());
  for (RequestId id : requests) {
    Request* r = FindRequest(id);
    // A request that got its first token in this step (or ended) has said more than progress.
    if (r == nullptr || r->phase == Request::Phase::kDone || r->phase == Request::Phase::kDecode ||
        !r->result.token_ids.empty() || !r->prepared.callbacks.on_prefill_progress) {
      continue;
    }
    int64_t ready = 0;
    for (const Segment& s : r->segments) {
      const EncodeJob* job = s.job != 0 ? FindJob(s.job) : nullptr;
      ready += job != nullptr ? job->ready : s.ready;
    }
    r->prepared.callbacks.on_prefill_progress(ready);
  }
}

void EngineCore::ReportQueued(absl::Time now) {
  if (now - last_queued_report_ < kQueuedReportInterval) return;
  last_queued_report_ = now;
  // Every request before its first token: those waiting for admission, and those admitted whose
  // prompt waits for the step's token budget behind older prompts (one whose prompt moved in
  // this step said so through on_prefill_progress too; a router takes either as life). A
  // preempted request that already streamed tokens has said more than this.
  for (auto& [id, r] : requests_) {
    if (r->phase == Request::Phase::kDone || !r->result.token_ids.empty() ||
        !r->prepared.callbacks.on_queued) {
      continue;
    }
    r->prepared.callbacks.on_queued();
  }
}

}  // namespace lazyattn
