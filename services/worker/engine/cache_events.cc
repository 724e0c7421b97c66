#include "services/worker/engine/cache_events.h"

namespace lazyattn {

void CacheMirror::set_listener(Listener listener) {
  std::lock_guard<std::mutex> lock(mu_);
  listener_ = std::move(listener);
}

void CacheMirror::Apply(const DocCacheKey& key, int64_t num_tokens, bool stored) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stored) {
    documents_[key] = num_tokens;
  } else {
    documents_.erase(key);
  }
  const CacheEvent event{.key = key, .num_tokens = num_tokens, .stored = stored,
                         .version = ++version_};
  if (listener_) listener_(event);
}

bool CacheMirror::Contains(const DocCacheKey& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  return documents_.contains(key);
}

CacheSnapshot CacheMirror::Snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  CacheSnapshot s;
  s.version = version_;
  s.documents.reserve(documents_.size());
  for (const auto& [key, tokens] : documents_) s.documents.push_back({key, tokens});
  return s;
}

}  // namespace lazyattn
