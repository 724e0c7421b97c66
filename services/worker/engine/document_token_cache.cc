#include "services/worker/engine/document_token_cache.h"

#include <utility>

namespace lazyattn {

std::optional<std::vector<int32_t>> DocumentTokenCache::Find(const DocumentKey& key) {
  absl::MutexLock lock(&mu_);
  auto it = index_.find(key);
  if (it == index_.end()) {
    ++misses_;
    return std::nullopt;
  }
  ++hits_;
  order_.splice(order_.begin(), order_, it->second);
  return it->second->tokens;
}

void DocumentTokenCache::Insert(const DocumentKey& key, std::vector<int32_t> tokens) {
  const int64_t size = static_cast<int64_t>(tokens.size());
  absl::MutexLock lock(&mu_);
  if (auto it = index_.find(key); it != index_.end()) {
    tokens_ -= static_cast<int64_t>(it->second->tokens.size());
    charged_ -= static_cast<int64_t>(it->second->tokens.size()) + entry_overhead_;
    order_.erase(it->second);
    index_.erase(it);
  }
  if (size + entry_overhead_ > capacity_) return;
  order_.push_front(Entry{key, std::move(tokens)});
  index_[key] = order_.begin();
  tokens_ += size;
  charged_ += size + entry_overhead_;
  while (charged_ > capacity_) {
    const Entry& last = order_.back();
    tokens_ -= static_cast<int64_t>(last.tokens.size());
    charged_ -= static_cast<int64_t>(last.tokens.size()) + entry_overhead_;
    index_.erase(last.key);
    order_.pop_back();
  }
}

int64_t DocumentTokenCache::tokens() const {
  absl::MutexLock lock(&mu_);
  return tokens_;
}

int64_t DocumentTokenCache::entries() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(index_.size());
}

int64_t DocumentTokenCache::charged() const {
  absl::MutexLock lock(&mu_);
  return charged_;
}

int64_t DocumentTokenCache::hits() const {
  absl::MutexLock lock(&mu_);
  return hits_;
}

int64_t DocumentTokenCache::misses() const {
  absl::MutexLock lock(&mu_);
  return misses_;
}

}  // namespace lazyattn
