#include "services/router/policy/document_placement.h"

#include <limits>

namespace lazyattn::router {

std::vector<int64_t> PlaceDocuments(std::optional<int64_t> prefix_tokens,
                                    std::span<const int64_t> exact_tokens) {
  std::vector<int64_t> offsets(exact_tokens.size(), kUnplaced);
  if (!prefix_tokens.has_value() || *prefix_tokens < 0) return offsets;
  int64_t offset = *prefix_tokens;
  for (size_t i = 0; i < exact_tokens.size(); ++i) {
    offsets[i] = offset;
    // An estimate, or a sum past what any prompt holds: the rest cannot be placed.
    if (exact_tokens[i] < 0 || exact_tokens[i] > std::numeric_limits<int64_t>::max() - offset) {
      break;
    }
    offset += exact_tokens[i];
  }
  return offsets;
}

std::optional<int64_t> PrefixLengths::Get(uint64_t prefix) const {
  absl::MutexLock lock(&mu_);
  auto it = tokens_.find(prefix);
  if (it == tokens_.end()) return std::nullopt;
  return it->second;
}

void PrefixLengths::Record(uint64_t prefix, int64_t tokens) {
  if (tokens < 0) return;
  absl::MutexLock lock(&mu_);
  if (tokens_.size() >= capacity_ && !tokens_.contains(prefix)) tokens_.clear();
  tokens_[prefix] = tokens;
}

size_t PrefixLengths::size() const {
  absl::MutexLock lock(&mu_);
  return tokens_.size();
}

}  // namespace lazyattn::router
