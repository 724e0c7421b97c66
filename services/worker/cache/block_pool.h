// Fixed-size KV blocks with reference counts and a free list (PagedAttention's block manager).
//
// A block is in exactly one of three states:
//   free                 on the free list, owned by nobody;
//   referenced           pinned by at least one running sequence (ref_count > 0);
//   cached-unreferenced  held only by a cache (document cache or radix tree) and evictable.
// A block can be referenced and cached at once (a running request reading a cached document);
// it counts as referenced then. Invariant, checked by CheckInvariant():
//   free + referenced + cached_unreferenced == total, no block on the free list twice.
//
// A cache that holds a block can ask to be told when the block becomes pinned (its ref count leaves
// 0) or unpinned (returns to 0 while cached): that keeps the caches' evictable entries in their own
// LRU order, so eviction never walks past pinned ones (PinObserver).
//
// Plain C++, no CUDA: the worker, the tests and the trace simulator share it. Not thread-safe: the
// engine loop owns it.
#ifndef LAZYATTN_SERVICES_WORKER_CACHE_BLOCK_POOL_H_
#define LAZYATTN_SERVICES_WORKER_CACHE_BLOCK_POOL_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace lazyattn {

using BlockId = uint32_t;

class BlockPool {
 public:
  // Told, synchronously inside Ref/Unref, when a cached block it owns changes between referenced
  // and cached-unreferenced. It must not call back into the pool's Ref/Unref/SetCached.
  class PinObserver {
   public:
    virtual void OnPinChange(BlockId b, bool pinned) = 0;

   protected:
    ~PinObserver() = default;
  };

  explicit BlockPool(int64_t num_blocks);

  int64_t num_blocks() const { return static_cast<int64_t>(ref_count_.size()); }
  int64_t num_free() const { return static_cast<int64_t>(free_.size()); }
  int64_t num_referenced() const { return num_referenced_; }
  int64_t num_cached_unreferenced() const { return num_cached_unreferenced_; }

  // Takes a free block, referenced once by the caller; nullopt when none is free (the caller may
  // evict cached blocks and retry).
  std::optional<BlockId> Allocate();

  // Pins / unpins a block for a running sequence. Unref of the last reference returns the block to
  // the free list unless a cache holds it.
  // Misuse is never undefined behaviour, in any build type: Ref of a free block, Unref of a block
  // nobody references, or an id outside the pool changes nothing, returns false and is counted in
  // errors() (the first described by first_error()). The engine checks errors() after every step.
  bool Ref(BlockId b);
  bool Unref(BlockId b);

  // A cache takes or drops ownership of a block. Uncache of an unreferenced block frees it.
  // Caching a free block is misuse (false, counted), as above. `observer` (may be null) is told of
  // the block's pin changes while it stays cached; uncaching forgets it. Caching a block that is
  // already cached keeps its observer.
  bool SetCached(BlockId b, bool cached, PinObserver* observer = nullptr);

  int64_t errors() const { return errors_; }
  const std::string& first_error() const { return first_error_; }

  int32_t ref_count(BlockId b) const { return ref_count_[b]; }
  bool cached(BlockId b) const { return cached_[b]; }
  bool is_free(BlockId b) const { return ref_count_[b] == 0 && !cached_[b]; }

  // Recounts every block's state; Internal naming the first discrepancy.
  absl::Status CheckInvariant() const;

 private:
  void Release(BlockId b);  // to the free list
  bool Misuse(const char* what, BlockId b);  // counts it; always false
  std::vector<int32_t> ref_count_;
  std::vector<bool> cached_;
  std::vector<PinObserver*> observer_;  // per cached block, or null
  std::vector<BlockId> free_;
  int64_t num_referenced_ = 0;
  int64_t num_cached_unreferenced_ = 0;
  int64_t errors_ = 0;
  std::string first_error_;
};

}  // namespace lazyattn

#endif  // LAZYATTN_SERVICES_WORKER_CACHE_BLOCK_POOL_H_
