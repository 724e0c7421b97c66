// The worker's KV memory in one place: the block pool, the document cache and the prefix tree,
// with one allocation path that evicts whichever cache holds the least recently used evictable
// KV when no block is free. Plain C++ (no CUDA, no tensors): the engine and the trace simulator
// share it.
#ifndef LAZYATTN_SERVICES_WORKER_CACHE_KV_CACHE_MANAGER_H_
#define LAZYATTN_SERVICES_WORKER_CACHE_KV_CACHE_MANAGER_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "services/worker/cache/block_pool.h"
#include "services/worker/cache/document_cache.h"
#include "services/worker/cache/prefix_cache.h"

namespace lazyattn {

class KvCacheManager {
 public:
  KvCacheManager(int64_t num_blocks, int block_size);

  BlockPool& pool() { return pool_; }
  const BlockPool& pool() const { return pool_; }
  DocumentCache& documents() { return documents_; }
  const DocumentCache& documents() const { return documents_; }
  PrefixCache& prefixes() { return prefixes_; }
  int block_size() const { return block_size_; }
  uint64_t Tick() { return documents_.Tick(); }

  // A block referenced once by the caller, evicting cached KV if needed; nullopt when every block
  // is pinned by running sequences.
  std::optional<BlockId> Allocate();
  // Blocks that Allocate() could provide right now (free + evictable-in-principle). Counts
  // cached-unreferenced blocks, which eviction can free (a pinned descendant can delay a prefix
  // node, so this is an upper bound for the prefix tree).
  int64_t AvailableBlocks() const {
    return pool_.num_free() + pool_.num_cached_unreferenced();
  }

  // Pool invariant plus: every cached block belongs to exactly one cache entry, and each cache's
  // evictable set holds exactly its entries with no pinned block.
  absl::Status CheckInvariant() const;

 private:
  int block_size_;
  BlockPool pool_;
  DocumentCache documents_;
  PrefixCache prefixes_;
};

}  // namespace lazyattn

#endif  // LAZYATTN_SERVICES_WORKER_CACHE_KV_CACHE_MANAGER_H_
