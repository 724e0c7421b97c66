// RadixAttention-style prefix cache over token ids, at block granularity: each tree edge is one
// full KV block (block_size tokens), so a match always ends on a block boundary and the matched
// blocks can be shared as they are. A partly filled last block is never shared (vLLM's automatic
// prefix caching makes the same choice).
//
// Ownership: tree nodes mark their blocks cached in the BlockPool; a request that reuses a prefix
// pins the matched blocks (Ref) and unpins them when done. Eviction removes least recently used
// leaves whose block is unpinned, so an interior node is evicted only after its subtree.
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

#include "services/worker/cache/block_pool.h"

namespace lazyattn {

class PrefixCache {
 public:
  PrefixCache(BlockPool* pool, int block_size);
  ~PrefixCache();  // releases every node's block to the pool

  struct Match {
    std::vector<BlockId> blocks;  // pinned for the caller (one Ref each)
    int64_t num_tokens = 0;       // blocks.size() * block_size
  };
  // Longest cached prefix of `tokens` in whole blocks, at most `max_tokens` long; pins it.
  Match MatchAndPin(std::span<const int32_t> tokens, int64_t max_tokens, uint64_t now);

  // Records that blocks[i] holds tokens [i*B, (i+1)*B) of `tokens`, for every full block. Blocks
  // of prefixes already in the tree are left to the caller; new ones become cached.
  void Insert(std::span<const int32_t> tokens, std::span<const BlockId> blocks, uint64_t now);

  // Evicts the least recently used unpinned leaf; returns blocks freed (0 or 1).
  int64_t EvictOne();
  std::optional<uint64_t> OldestEvictable() const;

  int64_t num_blocks() const { return num_nodes_; }
  void ForEachBlock(const std::function<void(BlockId)>& fn) const;

 private:
  struct Node {
    std::vector<int32_t> tokens;  // this edge's block of tokens (empty at the root)
    BlockId block = 0;
    Node* parent = nullptr;
    std::map<std::vector<int32_t>, std::unique_ptr<Node>> children;
    uint64_t last_use = 0;
  };
  const Node* OldestEvictableLeaf() const;
  // Leaves ordered by last use, so eviction looks at the oldest first instead of walking the
  // tree: it skips only leaves pinned by running requests. Interior nodes join when their last
  // child goes.
  void AddLeaf(Node* n) { leaves_.emplace(n->last_use, n); }
  void RemoveLeaf(Node* n) { leaves_.erase({n->last_use, n}); }
  void Touch(Node* n, uint64_t now);

  BlockPool* pool_;
  int block_size_;
  Node root_;
  int64_t num_nodes_ = 0;
  std::set<std::pair<uint64_t, Node*>> leaves_;
};

}  // namespace lazyattn

#endif  // LAZYATTN_SERVICES_WORKER_CACHE_PREFIX_CACHE_H_
