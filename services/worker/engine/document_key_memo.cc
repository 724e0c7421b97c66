#include "services/worker/engine/document_key_memo.h"

#include <algorithm>
#include <iterator>
#include <utility>

#include "absl/hash/hash.h"
#include "absl/types/span.h"

namespace lazyattn {

DocumentKey DocumentKeyMemo::KeyOf(const std::vector<int32_t>& tokens,
                                   const std::function<DocumentKey()>& compute,
                                   const std::vector<int32_t>& scope) {
  const int64_t size = static_cast<int64_t>(tokens.size());
  const int64_t charge = ChargeOf(tokens.size(), scope.size());
  if (size == 0 || charge > capacity_) {
    {
      absl::MutexLock lock(&mu_);
      ++misses_;
    }
    return compute();
  }
  const uint64_t hash = absl::HashOf(absl::MakeConstSpan(scope), absl::MakeConstSpan(tokens));
  {
    absl::MutexLock lock(&mu_);
    if (auto it = index_.find(hash); it != index_.end()) {
      for (Order::iterator e : it->second) {
        if (e->tokens == tokens && e->scope == scope) {
          ++hits_;
          order_.splice(order_.begin(), order_, e);
          return e->key;
        }
      }
    }
    ++misses_;
  }
  const DocumentKey key = compute();
  absl::MutexLock lock(&mu_);
  std::vector<Order::iterator>& bucket = index_[hash];
  for (Order::iterator e : bucket) {
    if (e->tokens == tokens && e->scope == scope) return key;  // remembered meanwhile
  }
  order_.push_front(Entry{hash, scope, tokens, key});
  bucket.push_back(order_.begin());
  tokens_ += size;
  charged_ += charge;
  while (charged_ > capacity_) {
    const Order::iterator last = std::prev(order_.end());
    auto bucket_it = index_.find(last->hash);
    auto& entries = bucket_it->second;
    entries.erase(std::find(entries.begin(), entries.end(), last));
    if (entries.empty()) index_.erase(bucket_it);
    tokens_ -= static_cast<int64_t>(last->tokens.size());
    charged_ -= ChargeOf(last->tokens.size(), last->scope.size());
    order_.erase(last);
  }
  return key;
}

int64_t DocumentKeyMemo::tokens() const {
  absl::MutexLock lock(&mu_);
  return tokens_;
}

int64_t DocumentKeyMemo::entries() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(order_.size());
}

int64_t DocumentKeyMemo::charged() const {
  absl::MutexLock lock(&mu_);
  return charged_;
}

int64_t DocumentKeyMemo::hits() const {
  absl::MutexLock lock(&mu_);
  return hits_;
}

int64_t DocumentKeyMemo::misses() const {
  absl::MutexLock lock(&mu_);
  return misses_;
}

}  // namespace lazyattn
