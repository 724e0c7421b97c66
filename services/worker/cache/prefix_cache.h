// RadixAttention-style prefix cache over token ids, at block granularity: each tree edge is one
// full KV block (block_size tokens), so a match always ends on a block boundary and the matched
// blocks can be shared as they are. A partly filled last block is never shared (vLLM's automatic
// prefix caching makes the same choice).
//
// Ownership: tree nodes mark their blocks cached in the BlockPool; a request that reuses a prefix
// pins the matched blocks (Ref) and unpins them when done. Eviction removes least recently used
// leaves whose block is unpinned, so an interior node is evicted only after its subtree. The pool
// tells the tree when a node's block is pinned or unpinned (BlockPool::PinObserver), and only
// unpinned leaves are kept in the eviction order: the oldest is found in O(1), never by walking
// past leaves that running requests pin.
//
// Plain C++, not thread-safe (the engine loop owns it).
#ifndef LAZYATTN_SERVICES_WORKER_CACHE_PREFIX_CACHE_H_
#define LAZYATTN_SERVICES_WORKER_CACHE_PREFIX_CACHE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <utility>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "services/worker/cache/block_pool.h"

namespace lazyattn {

class PrefixCache : private BlockPool::PinObserver {
 public:
  PrefixCache(BlockPool* pool, int block_size);
  ~PrefixCache();  // releases every node's block to the pool
  // The pool keeps a pointer to this cache (its pin observer): not copyable or movable.
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  struct Match {
    std::vector<BlockId> blocks;  // pinned for the caller (one Ref each)
    int64_t num_tokens = 0;       // blocks.size() * block_size
  };
  // Longest cached prefix of `tokens` in whole blocks, at most `max_tokens` long; pins it.
  // `scope`: the request's cache scope words (PrefixScopeWords, common/document_key.h; empty for
  // the shared scope): only prefixes inserted under the same words match.
  Match MatchAndPin(std::span<const int32_t> tokens, int64_t max_tokens, uint64_t now,
                    std::span<const int32_t> scope = {});

  // Records that blocks[i] holds tokens [i*B, (i+1)*B) of `tokens`, for every full block, under
  // `scope` (as MatchAndPin). Blocks of prefixes already in the tree are left to the caller; new
  // ones become cached.
  void Insert(std::span<const int32_t> tokens, std::span<const BlockId> blocks, uint64_t now,
              std::span<const int32_t> scope = {});

  // Evicts the least recently used unpinned leaf; returns blocks freed (0 or 1).
  int64_t EvictOne();
  std::optional<uint64_t> OldestEvictable() const;

  int64_t num_blocks() const { return num_nodes_; }
  void ForEachBlock(const std::function<void(BlockId)>& fn) const;
  // Every leaf with its block and last use (tests compare eviction with a walk over them).
  void ForEachLeaf(const std::function<void(BlockId, uint64_t last_use)>& fn) const;
  // Checks that exactly the unpinned leaves are in the eviction order; Internal otherwise.
  absl::Status CheckEvictable() const;

 private:
  struct Node {
    // This edge's block of tokens, its key in the parent's children (empty at the root). Below
    // the root the block's tokens follow the scope's words: each scope has its own subtrees.
    std::vector<int32_t> tokens;
    BlockId block = 0;
    Node* parent = nullptr;
    std::map<std::vector<int32_t>, std::unique_ptr<Node>> children;
    uint64_t last_use = 0;
  };
  // The key of the child of `parent` that holds tokens [start, start + block_size_).
  std::vector<int32_t> EdgeKey(const Node* parent, std::span<const int32_t> tokens, size_t start,
                               std::span<const int32_t> scope) const;
  const Node* OldestEvictableLeaf() const;
  bool IsLeaf(const Node* n) const { return n != &root_ && n->children.empty(); }
  bool Evictable(const Node* n) const { return IsLeaf(n) && pool_->ref_count(n->block) == 0; }
  // Unpinned leaves ordered by last use: eviction takes the first. A node joins when it becomes
  // an unpinned leaf (its last child evicted, its block unpinned) and leaves when it gets a
  // child or a pin. The caller calls these where leaf-ness or last_use changes.
  void AddIfEvictable(Node* n) {
    if (Evictable(n)) evictable_.emplace(n->last_use, n);
  }
  void Remove(Node* n) { evictable_.erase({n->last_use, n}); }
  void Touch(Node* n, uint64_t now);
  void OnPinChange(BlockId b, bool pinned) override;

  BlockPool* pool_;
  int block_size_;
  Node root_;
  int64_t num_nodes_ = 0;
  std::vector<Node*> node_of_;  // by block id: the node holding it, or null
  std::set<std::pair<uint64_t, Node*>> evictable_;
};

}  // namespace lazyattn

#endif  // LAZYATTN_SERVICES_WORKER_CACHE_PREFIX_CACHE_H_
