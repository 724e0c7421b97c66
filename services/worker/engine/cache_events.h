// What enters and leaves the document cache, for observers on other threads (the worker publishes
// it to kvdir). The engine thread applies each DocumentCache store/eviction to a mirror of the
// cache's entries and forwards it, numbered, to one listener; any thread can take a snapshot.
//
// Versions make a snapshot and the event stream consistent: a snapshot reflects exactly the events
// with version <= snapshot.version, so a consumer that sends a snapshot drops the queued events
// it already covers and keeps the later ones.
#ifndef LAZYATTN_SERVICES_WORKER_ENGINE_CACHE_EVENTS_H_
#define LAZYATTN_SERVICES_WORKER_ENGINE_CACHE_EVENTS_H_

#include <cstdint>
#include <functional>
#include <mutex>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "services/worker/cache/document_cache.h"

namespace lazyattn {

struct CacheEvent {
  DocCacheKey key;
  int64_t num_tokens = 0;
  bool stored = true;    // false: evicted
  uint64_t version = 0;  // 1, 2, ... in the order the cache changed
};

struct CachedDocumentInfo {
  DocCacheKey key;
  int64_t num_tokens = 0;
};

struct CacheSnapshot {
  uint64_t version = 0;  // the last event this snapshot reflects (0: none yet)
  std::vector<CachedDocumentInfo> documents;
};

// Thread-safe.
class CacheMirror {
 public:
  // Runs under the mirror's lock, in version order, on the thread that calls Apply (the engine
  // thread): it must be short and must not block nor call back into the mirror.
  using Listener = std::function<void(const CacheEvent&)>;

  void set_listener(Listener listener);
  void Apply(const DocCacheKey& key, int64_t num_tokens, bool stored);
  CacheSnapshot Snapshot() const;
  // Whether the cache held `key` as of the last Apply.
  bool Contains(const DocCacheKey& key) const;

 private:
  mutable std::mutex mu_;
  absl::flat_hash_map<DocCacheKey, int64_t> documents_ ABSL_GUARDED_BY(mu_);
  uint64_t version_ ABSL_GUARDED_BY(mu_) = 0;
  Listener listener_ ABSL_GUARDED_BY(mu_);
};

}  // namespace lazyattn

#endif  // LAZYATTN_SERVICES_WORKER_ENGINE_CACHE_EVENTS_H_
