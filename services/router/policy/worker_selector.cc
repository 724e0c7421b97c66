#include "services/router/policy/worker_selector.h"

#include <algorithm>

namespace lazyattn::router {

Selection WorkerSelector::Select(std::span<const WorkerObservation> workers,
                                 std::span<const DocumentRef> docs, absl::Time now) {
  Selection selection;
  const size_t n = workers.size();
  selection.predicted_hit_tokens.assign(n, 0);

  // Speculative holders per document, looked up once.
  std::vector<std::vector<std::string>> holders(docs.size());
  for (size_t d = 0; d < docs.size(); ++d) holders[d] = speculative_.Holders(docs[d].key, now);

  for (size_t w = 0; w < n; ++w) {
    const WorkerObservation& obs = workers[w];
    int64_t hits = obs.resident_tokens;
    for (size_t d = 0; d < docs.size(); ++d) {
      const bool known = d < obs.resident.size() && obs.resident[d];
      if (known) continue;
      if (std::find(holders[d].begin(), holders[d].end(), obs.id) != holders[d].end()) {
        hits += docs[d].estimated_tokens;
      }
    }
    selection.predicted_hit_tokens[w] = hits;
  }

  std::vector<size_t> eligible;
  std::vector<bool> admitted(n);
  for (size_t w = 0; w < n; ++w) {
    const WorkerObservation& obs = workers[w];
    admitted[w] = outliers_.Admitted(obs.address.empty() ? obs.id : obs.address);
    if (admitted[w] && breakers_.Available(workers[w].id, now)) eligible.push_back(w);
  }
  if (eligible.empty() && n > 0) {
    selection.breaker_panic = true;
    for (size_t w = 0; w < n; ++w) {
      if (admitted[w]) eligible.push_back(w);
    }
    if (eligible.empty()) {
      for (size_t w = 0; w < n; ++w) eligible.push_back(w);
    }
  }

  std::vector<Candidate> candidates;
  candidates.reserve(eligible.size());
  for (size_t w : eligible) {
    const WorkerObservation& obs = workers[w];
    candidates.push_back(Candidate{
        .id = obs.id,
        .hit_tokens = selection.predicted_hit_tokens[w],
        .queued_prefill_tokens = std::max<int64_t>(0, obs.queued_prefill_tokens),
        .requests = std::max<int64_t>({0, obs.requests, obs.router_inflight}),
    });
  }
  Ranking ranking = policy_.Rank(candidates);
  selection.imbalance_fallback = ranking.imbalance_fallback;
  selection.order.reserve(ranking.order.size());
  for (size_t i : ranking.order) selection.order.push_back(eligible[i]);
  return selection;
}

void WorkerSelector::RecordChoice(std::span<const DocumentRef> docs, const std::string& worker,
                                  absl::Time now) {
  if (docs.empty()) return;
  std::vector<DocumentKey> keys;
  keys.reserve(docs.size());
  for (const DocumentRef& d : docs) keys.push_back(d.key);
  speculative_.Record(keys, worker, now);
}

}  // namespace lazyattn::router
