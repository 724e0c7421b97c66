#include "services/worker/cache/prefix_cache.h"

#include <vector>

#include "absl/strings/str_cat.h"

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

PrefixCache::PrefixCache(BlockPool* pool, int block_size)
    : pool_(pool),
      block_size_(block_size),
      node_of_(static_cast<size_t>(pool->num_blocks()), nullptr) {}

PrefixCache::~PrefixCache() {
  Walk(root_, [&](Node& n) { pool_->SetCached(n.block, false); });
}

std::vector<int32_t> PrefixCache::EdgeKey(const Node* parent, std::span<const int32_t> tokens,
                                          size_t start, std::span<const int32_t> scope) const {
  std::vector<int32_t> key;
  if (parent == &root_) {
    key.reserve(scope.size() + block_size_);
    key.assign(scope.begin(), scope.end());
  }
  key.insert(key.end(), tokens.begin() + start, tokens.begin() + start + block_size_);
  return key;
}

PrefixCache::Match PrefixCache::MatchAndPin(std::span<const int32_t> tokens, int64_t max_tokens,
                                            uint64_t now, std::span<const int32_t> scope) {
  Match match;
  Node* node = &root_;
  const int64_t limit = std::min<int64_t>(max_tokens, static_cast<int64_t>(tokens.size()));
  for (int64_t start = 0; start + block_size_ <= limit; start += block_size_) {
    const std::vector<int32_t> key = EdgeKey(node, tokens, static_cast<size_t>(start), scope);
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
                         uint64_t now, std::span<const int32_t> scope) {
  Node* node = &root_;
  for (size_t i = 0; i < blocks.size() && (i + 1) * block_size_ <= tokens.size(); ++i) {
    std::vector<int32_t> key = EdgeKey(node, tokens, i * block_size_, scope);
    auto it = node->children.find(key);
    if (it == node->children.end()) {
      auto child = std::make_unique<Node>();
      child->tokens = key;
      child->block = blocks[i];
      child->parent = node;
      child->last_use = now;
      pool_->SetCached(blocks[i], true, this);
      if (blocks[i] < node_of_.size()) node_of_[blocks[i]] = child.get();
      ++num_nodes_;
      Remove(node);  // no longer a leaf
      Node* added = child.get();
      it = node->children.emplace(std::move(key), std::move(child)).first;
      AddIfEvictable(added);
    }
    // Another request cached these tokens in its own block first (both computed them at
    // once): the caller's deeper blocks stay its own. Hung under that node they would keep it,
    // unpinned and counted as evictable, from being evicted while the caller holds them.
    if (it->second->block != blocks[i]) return;
    node = it->second.get();
    Touch(node, now);
  }
}

void PrefixCache::Touch(Node* n, uint64_t now) {
  if (n->last_use == now) return;
  Remove(n);
  n->last_use = now;
  AddIfEvictable(n);
}

void PrefixCache::OnPinChange(BlockId b, bool pinned) {
  Node* n = b < node_of_.size() ? node_of_[b] : nullptr;
  if (n == nullptr) return;
  if (pinned) {
    Remove(n);
  } else {
    AddIfEvictable(n);
  }
}

const PrefixCache::Node* PrefixCache::OldestEvictableLeaf() const {
  return evictable_.empty() ? nullptr : evictable_.begin()->second;
}

std::optional<uint64_t> PrefixCache::OldestEvictable() const {
  const Node* n = OldestEvictableLeaf();
  if (n == nullptr) return std::nullopt;
  return n->last_use;
}

int64_t PrefixCache::EvictOne() {
  const Node* leaf = OldestEvictableLeaf();
  if (leaf == nullptr) return 0;
  Remove(const_cast<Node*>(leaf));
  if (leaf->block < node_of_.size()) node_of_[leaf->block] = nullptr;
  pool_->SetCached(leaf->block, false);
  --num_nodes_;
  Node* parent = leaf->parent;
  parent->children.erase(leaf->tokens);  // destroys the leaf
  AddIfEvictable(parent);
  return 1;
}

void PrefixCache::ForEachLeaf(const std::function<void(BlockId, uint64_t)>& fn) const {
  Walk(root_, [&](const Node& n) {
    if (n.children.empty()) fn(n.block, n.last_use);
  });
}

absl::Status PrefixCache::CheckEvictable() const {
  size_t evictable = 0;
  absl::Status status;
  Walk(root_, [&](const Node& n) {
    const bool listed = evictable_.contains({n.last_use, const_cast<Node*>(&n)});
    evictable += listed;
    if (status.ok() && listed != Evictable(&n)) {
      status = absl::InternalError(absl::StrCat("prefix tree node of block ", n.block,
                                                listed ? " listed" : " not listed",
                                                " as an evictable leaf"));
    }
  });
  if (status.ok() && evictable != evictable_.size()) {
    status = absl::InternalError(absl::StrCat("prefix tree lists ", evictable_.size(),
                                              " evictable leaves, ", evictable, " are"));
  }
  return status;
}

void PrefixCache::ForEachBlock(const std::function<void(BlockId)>& fn) const {
  Walk(root_, [&](const Node& n) { fn(n.block); });
}

}  // namespace lazyattn
