#include "services/router/policy/worker_selector.h"

#include <algorithm>
#include <cmath>

namespace lazyattn::router {
namespace {

// The most tokens `doc` can have (DocumentRef::max_tokens; kMaxObservedTokens when unknown).
int64_t TokenBound(const DocumentRef& doc) {
  return doc.max_tokens > 0 ? std::min(doc.max_tokens, kMaxObservedTokens) : kMaxObservedTokens;
}

}  // namespace

std::optional<DocumentKey> SpeculativeKey(const DocumentRef& doc) {
  if (!doc.positional) return doc.key;
  if (doc.relative_offset < 0) return std::nullopt;
  // A keyed mix (splitmix64's constants), so (key, prefix, offset) triples of one document spread
  // apart and never equal the document's own lazy key in practice.
  uint64_t x = (doc.prefix ^ static_cast<uint64_t>(doc.relative_offset)) + 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return DocumentKey{doc.key.hi ^ x, doc.key.lo ^ ~x};
}

void PlaceBlockDocuments(std::span<DocumentRef> refs, uint64_t prefix,
                         std::optional<int64_t> prefix_tokens,
                         std::span<const int64_t> exact_tokens) {
  const std::vector<int64_t> offsets = PlaceDocuments(prefix_tokens, exact_tokens);
  const std::vector<int64_t> relative = PlaceDocuments(0, exact_tokens);
  for (DocumentRef& ref : refs) {
    const bool known =
        ref.document_index >= 0 && static_cast<size_t>(ref.document_index) < offsets.size();
    ref.positional = true;
    ref.prefix = prefix;
    ref.offset = known ? offsets[ref.document_index] : kUnplaced;
    ref.relative_offset = known ? relative[ref.document_index] : kUnplaced;
  }
}

Selection WorkerSelector::Select(std::span<const WorkerObservation> workers,
                                 std::span<const DocumentRef> docs, absl::Time now) {
  Selection selection;
  const size_t n = workers.size();
  selection.predicted_hit_tokens.assign(n, 0);
  selection.claimed_tokens.assign(n, -1);
  selection.claimed_copy_tokens.assign(n, -1);

  // Speculative holders per document, looked up once.
  std::vector<std::vector<std::string>> holders(docs.size());
  for (size_t d = 0; d < docs.size(); ++d) {
    if (auto key = SpeculativeKey(docs[d])) holders[d] = speculative_.Holders(*key, now);
  }

  std::vector<int64_t> copy_tokens(n, 0), ranked_hits(n, 0);
  for (size_t w = 0; w < n; ++w) {
    const WorkerObservation& obs = workers[w];
    const bool resident_known = obs.resident.size() == docs.size();
    int64_t resident_bound = 0, other_bound = 0;
    for (size_t d = 0; d < docs.size(); ++d) {
      (resident_known && !obs.resident[d] ? other_bound : resident_bound) += TokenBound(docs[d]);
    }
    if (!resident_known) other_bound = resident_bound;
    const int64_t claimed = std::clamp<int64_t>(obs.resident_tokens, 0, resident_bound);
    const int64_t copyable = std::clamp<int64_t>(obs.copyable_tokens, 0, other_bound);
    const double credit = claims_.Credit(obs.id);
    copy_tokens[w] = std::llround(credit * static_cast<double>(copyable));
    int64_t speculative = 0;
    for (size_t d = 0; d < docs.size(); ++d) {
      const bool known = d < obs.resident.size() && obs.resident[d];
      if (known) continue;
      if (std::find(holders[d].begin(), holders[d].end(), obs.id) != holders[d].end()) {
        speculative += docs[d].estimated_tokens;
      }
    }
    selection.predicted_hit_tokens[w] = claimed + speculative;
    if (speculative == 0) {
      selection.claimed_tokens[w] = claimed + copyable;
      selection.claimed_copy_tokens[w] = copyable;
    }
    ranked_hits[w] = std::llround(credit * static_cast<double>(claimed)) + speculative;
  }

  std::vector<size_t> eligible;
  std::vector<bool> admitted(n);
  for (size_t w = 0; w < n; ++w) {
    const WorkerObservation& obs = workers[w];
    admitted[w] = outliers_.Admitted(OutlierKey(obs.id, obs.address));
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
        .hit_tokens = ranked_hits[w],
        .queued_prefill_tokens =
            std::clamp<int64_t>(obs.queued_prefill_tokens, 0, kMaxObservedTokens),
        .requests = std::max<int64_t>({0, obs.requests, obs.router_inflight}),
        .copy_tokens = copy_tokens[w],
    });
  }
  Ranking ranking = policy_.Rank(candidates);
  selection.imbalance_fallback = ranking.imbalance_fallback;
  selection.order.reserve(ranking.order.size());
  for (size_t i : ranking.order) selection.order.push_back(eligible[i]);
  return selection;
}

void WorkerSelector::RecordChoice(std::span<const DocumentRef> docs, const std::string& worker,
                                  absl::Time now, std::optional<absl::Duration> hold) {
  if (docs.empty()) return;
  std::vector<DocumentKey> keys;
  keys.reserve(docs.size());
  for (const DocumentRef& d : docs) {
    if (auto key = SpeculativeKey(d)) keys.push_back(*key);
  }
  if (!keys.empty()) speculative_.Record(keys, worker, now, hold);
}

}  // namespace lazyattn::router
