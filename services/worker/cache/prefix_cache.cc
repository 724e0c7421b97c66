#include "services/worker/cache/prefix_cache.h"

#include <vector>

namespace lazyattn {
namespace {

template <typename NodeT, typename Fn>
void Walk(NodeT& node, const Fn& fn) {
  for (auto& [key, child] : node.children) {
    fn(*child);
    Walk(*child, fn);
  }
}

}  // namespace

PrefixCache::PrefixCache(BlockPool* pool, int block_size) : pool_(pool), block_size_(block_size) {}

PrefixCache::~PrefixCache() {
  Walk(root_, [&](Node& n) { pool_->SetCached(n.block, false); });
}

PrefixCache::Match PrefixCache::MatchAndPin(std::span<const int32_t> tokens, int64_t max_tokens,
                                            uint64_t now) {
  Match match;
  Node* node = &root_;
  const int64_t limit = std::min<int64_t>(max_tokens, static_cast<int64_t>(tokens.size()));
  for (int64_t start = 0; start + block_size_ <= limit; start += block_size_) {
    std::vector<int32_t> key(tokens.begin() + start, tokens.begin() + start + block_size_);
    auto it = node->children.find(key);
    if (it == node->children.end()) break;
    node = it->second.get();
    Touch(node, now);
    pool_->Ref(node->block);
    match.blocks.push_back(node->block);
    match.num_tokens += block_size_;
  }
  return match;
}

void PrefixCache::Insert(std::span<const int32_t> tokens, std::span<const BlockId> blocks,
                         uint64_t now) {
  Node* node = &root_;
  for (size_t i = 0; i < blocks.size() && (i + 1) * block_size_ <= tokens.size(); ++i) {
    std::vector<int32_t> key(tokens.begin() + i * block_size_,
                             tokens.begin() + (i + 1) * block_size_);
    auto it = node->children.find(key);
    if (it == node->children.end()) {
      auto child = std::make_unique<Node>();
      child->tokens = key;
      child->block = blocks[i];
      child->parent = node;
      pool_->SetCached(blocks[i], true);
      ++num_nodes_;
      if (node != &root_ && node->children.empty()) RemoveLeaf(node);
      child->last_use = now;
      AddLeaf(child.get());
      it = node->children.emplace(std::move(key), std::move(child)).first;
    }
    node = it->second.get();
    Touch(node, now);
  }
}

void PrefixCache::Touch(Node* n, uint64_t now) {
  if (n->last_use == now) return;
  const bool leaf = n->children.empty();
  if (leaf) RemoveLeaf(n);
  n->last_use = now;
  if (leaf) AddLeaf(n);
}

const PrefixCache::Node* PrefixCache::OldestEvictableLeaf() const {
  for (const auto& [last_use, n] : leaves_) {
    if (pool_->ref_count(n->block) == 0) return n;
  }
  return nullptr;
}

std::optional<uint64_t> PrefixCache::OldestEvictable() const {
  const Node* n = OldestEvictableLeaf();
  if (n == nullptr) return std::nullopt;
  return n->last_use;
}

int64_t PrefixCache::EvictOne() {
  const Node* leaf = OldestEvictableLeaf();
  if (leaf == nullptr) return 0;
  pool_->SetCached(leaf->block, false);
  --num_nodes_;
  Node* parent = leaf->parent;
  RemoveLeaf(const_cast<Node*>(leaf));
  parent->children.erase(leaf->tokens);  // destroys the leaf
  if (parent != &root_ && parent->children.empty()) AddLeaf(parent);
  return 1;
}

void PrefixCache::ForEachBlock(const std::function<void(BlockId)>& fn) const {
  Walk(root_, [&](const Node& n) { fn(n.block); });
}

}  // namespace lazyattn
