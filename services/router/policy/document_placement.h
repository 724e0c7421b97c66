// Where a request places its documents, for exact predictions in mode block: a block-mode entry's
// K was rotated for one global offset, so it is a hit only for a request that places the document
// at that same offset (DESIGN.md section 3; docs/router.md, "Predictions").
//
// A document's global offset is the tokens before the first document (the system prefix and the
// chat template's start, which only a tokenizer knows) plus the tokens of the documents before it.
// The router has no tokenizer: it learns the first part from the workers, which report it in
// Usage.prefix_tokens, keyed by a fingerprint of what shapes it (PrefixLengths), and knows the
// second part exactly for token-id documents. Where either is unknown (a prefix not seen yet, a
// text document earlier in the request) the offset is kUnplaced and the document is predicted as
// no hit: an exact prediction of nothing beats a guess.
#ifndef LAZYATTN_SERVICES_ROUTER_POLICY_DOCUMENT_PLACEMENT_H_
#define LAZYATTN_SERVICES_ROUTER_POLICY_DOCUMENT_PLACEMENT_H_

#include <cstdint>
#include <optional>
#include <span>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"

namespace lazyattn::router {

// An offset the router cannot know.
inline constexpr int64_t kUnplaced = -1;

// Global offsets of a request's documents, in request order: `prefix_tokens` plus the tokens of
// the documents before each. `exact_tokens[i]` is document i's token count, or a negative value
// when only estimated (a text document): every later document is kUnplaced, as is every document
// when `prefix_tokens` is unknown.
std::vector<int64_t> PlaceDocuments(std::optional<int64_t> prefix_tokens,
                                    std::span<const int64_t> exact_tokens);

// Tokens before the first document, per prompt-prefix fingerprint (a hash of the model and of
// what the template renders before the documents), as workers reported them. Bounded: at
// `capacity` entries the table is cleared (a prefix seen again is learned again from its next
// answer). Thread-safe.
class PrefixLengths {
 public:
  explicit PrefixLengths(size_t capacity = 4096) : capacity_(capacity) {}

  std::optional<int64_t> Get(uint64_t prefix) const ABSL_LOCKS_EXCLUDED(mu_);
  // A negative `tokens` is ignored.
  void Record(uint64_t prefix, int64_t tokens) ABSL_LOCKS_EXCLUDED(mu_);
  size_t size() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const size_t capacity_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, int64_t> tokens_ ABSL_GUARDED_BY(mu_);
};

}  // namespace lazyattn::router

#endif  // LAZYATTN_SERVICES_ROUTER_POLICY_DOCUMENT_PLACEMENT_H_
