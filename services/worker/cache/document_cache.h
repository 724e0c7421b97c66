// Cache of documents' KV blocks: one entry per document key (mode `lazy`: valid at any position),
// or per (document key, global offset) (mode `block`: K was rotated at that offset).
//
// Ownership: an entry's blocks are marked cached in the BlockPool; requests that use an entry pin
// its blocks with BlockPool::Ref and unpin with Unref. Only entries none of whose blocks is pinned
// can be evicted. Eviction is least-recently-used: RAG popularity is skewed (Zipf), and recency
// tracks the hot set well; a frequency-aware policy can replace EvictOne() behind this interface.
//
// Cost: the pool tells the cache when one of its blocks is pinned or unpinned (PinObserver), and
// the evictable entries (no block pinned) are kept apart, ordered by last use. Finding the oldest
// evictable entry is O(1) however many entries running requests pin; a lookup, or an entry's first
// pin / last unpin, costs O(log evictable entries). The order is exactly the single LRU list's
// with pinned entries skipped.
//
// Plain C++, not thread-safe (the engine loop owns it); the trace simulator links it too.
#ifndef LAZYATTN_SERVICES_WORKER_CACHE_DOCUMENT_CACHE_H_
#define LAZYATTN_SERVICES_WORKER_CACHE_DOCUMENT_CACHE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/node_hash_map.h"
#include "absl/status/status.h"
#include "common/document_key.h"
#include "services/worker/cache/block_pool.h"

namespace lazyattn {

// A document's cache identity. offset == kAnyOffset for position-agnostic (lazy) entries.
struct DocCacheKey {
  static constexpr int64_t kAnyOffset = -1;
  DocumentKey doc;
  int64_t offset = kAnyOffset;
  bool operator==(const DocCacheKey&) const = default;
  template <typename H>
  friend H AbslHashValue(H h, const DocCacheKey& k) {
    return H::combine(std::move(h), k.doc, k.offset);
  }
};

struct CachedDocument {
  std::vector<BlockId> blocks;
  int64_t num_tokens = 0;
  uint64_t last_use = 0;  // logical clock of the last lookup or insert
  int64_t hits = 0;
};

class DocumentCache : private BlockPool::PinObserver {
 public:
  // Observer of what enters and leaves the cache (the worker publishes these to kvdir).
  using Listener = std::function<void(const DocCacheKey& key, int64_t num_tokens, bool stored)>;

  explicit DocumentCache(BlockPool* pool);
  ~DocumentCache();  // releases every entry's blocks to the pool
  // The pool keeps a pointer to this cache (its pin observer): not copyable or movable.
  DocumentCache(const DocumentCache&) = delete;
  DocumentCache& operator=(const DocumentCache&) = delete;
  void set_listener(Listener listener) { listener_ = std::move(listener); }

  // The entry, or nullptr. A hit refreshes its LRU position and counts a hit.
  const CachedDocument* Lookup(const DocCacheKey& key);
  // An entry of `doc` to copy to another offset (mode `block` copies it rather than
  // recomputing): among the entries that were computed, never copied, the one at the lowest
  // offset, a position-agnostic entry (offset -1) first. Deterministic. Each copy re-rotates
  // keys already rounded to the pool's type and rounds them again, so a copy of a copy would be
  // two roundings from the document encoded there, and a chain of them more: copies are one.
  const CachedDocument* FindAnyOffset(const DocumentKey& doc, DocCacheKey* found_key);
  // Whether FindAnyOffset would find an entry of `doc`.
  bool HasCopySource(const DocumentKey& doc) const { return copy_sources_.contains(doc); }
  bool Contains(const DocCacheKey& key) const { return entries_.contains(key); }

  // Adds a document, computed or (`copied`) copied from an entry at another offset. The blocks
  // must be held by the caller (referenced); the cache marks them cached, so the caller's later
  // Unref leaves them cached-unreferenced. Returns false (and takes nothing) if the key is
  // already present.
  enum class Origin { kComputed, kCopied };
  bool Insert(const DocCacheKey& key, std::vector<BlockId> blocks, int64_t num_tokens,
              Origin origin = Origin::kComputed);

  // Evicts the least recently used entry whose blocks are all unpinned; returns the number of
  // blocks freed (0 when nothing can be evicted). `last_use` of that entry is reported through
  // OldestEvictable() so the engine can choose between caches.
  int64_t EvictOne();
  std::optional<uint64_t> OldestEvictable() const;

  int64_t num_entries() const { return static_cast<int64_t>(entries_.size()); }
  int64_t num_blocks() const { return num_blocks_; }
  uint64_t Tick() { return ++clock_; }
  // For invariant checks: every cached block of every entry.
  void ForEachBlock(const std::function<void(BlockId)>& fn) const;
  // Recounts every entry's pinned blocks against the pool; Internal naming the first entry whose
  // count, or whose place among the evictable entries, is wrong. O(cached blocks).
  absl::Status CheckEvictable() const;

 private:
  struct Slot {
    DocCacheKey key;
    CachedDocument doc;
    int64_t pinned_blocks = 0;  // blocks with a reference; evictable at 0
  };
  void OnPinChange(BlockId b, bool pinned) override;

  BlockPool* pool_;
  absl::node_hash_map<DocCacheKey, Slot> entries_;  // node map: Slot addresses are stable
  // Per document, the offsets of its computed entries (FindAnyOffset's candidates).
  absl::flat_hash_map<DocumentKey, std::set<int64_t>> copy_sources_;
  std::vector<Slot*> owner_;  // by block id: the entry holding it, or null
  // Entries with no pinned block by last_use (unique: one clock): begin() is evicted next.
  std::map<uint64_t, Slot*> evictable_;
  int64_t num_blocks_ = 0;
  uint64_t clock_ = 0;
  Listener listener_;
};

}  // namespace lazyattn

#endif  // LAZYATTN_SERVICES_WORKER_CACHE_DOCUMENT_CACHE_H_
