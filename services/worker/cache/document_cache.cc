#include "services/worker/cache/document_cache.h"

namespace lazyattn {

DocumentCache::~DocumentCache() {
  for (auto& [key, slot] : entries_) {
    for (BlockId b : slot.doc.blocks) pool_->SetCached(b, false);
  }
}

const CachedDocument* DocumentCache::Lookup(const DocCacheKey& key) {
  auto it = entries_.find(key);
  if (it == entries_.end()) return nullptr;
  Slot& s = it->second;
  s.doc.last_use = Tick();
  ++s.doc.hits;
  lru_.splice(lru_.end(), lru_, s.lru);
  return &s.doc;
}

const CachedDocument* DocumentCache::FindAnyOffset(const DocumentKey& doc, DocCacheKey* found) {
  auto it = offsets_.find(doc);
  if (it == offsets_.end() || it->second.empty()) return nullptr;
  *found = {doc, *it->second.begin()};
  return Lookup(*found);
}

bool DocumentCache::Insert(const DocCacheKey& key, std::vector<BlockId> blocks,
                           int64_t num_tokens) {
  if (entries_.contains(key)) return false;
  for (BlockId b : blocks) pool_->SetCached(b, true);
  num_blocks_ += static_cast<int64_t>(blocks.size());
  lru_.push_back(key);
  offsets_[key.doc].insert(key.offset);
  Slot slot{.doc = {.blocks = std::move(blocks), .num_tokens = num_tokens, .last_use = Tick()},
            .lru = std::prev(lru_.end())};
  entries_.emplace(key, std::move(slot));
  if (listener_) listener_(key, num_tokens, /*stored=*/true);
  return true;
}

bool DocumentCache::Evictable(const CachedDocument& d) const {
  for (BlockId b : d.blocks) {
    if (pool_->ref_count(b) > 0) return false;
  }
  return true;
}

std::optional<uint64_t> DocumentCache::OldestEvictable() const {
  for (const DocCacheKey& key : lru_) {
    const CachedDocument& d = entries_.at(key).doc;
    if (Evictable(d)) return d.last_use;
  }
  return std::nullopt;
}

int64_t DocumentCache::EvictOne() {
  for (auto it = lru_.begin(); it != lru_.end(); ++it) {
    auto e = entries_.find(*it);
    if (!Evictable(e->second.doc)) continue;
    const DocCacheKey key = *it;
    const int64_t tokens = e->second.doc.num_tokens;
    const int64_t freed = static_cast<int64_t>(e->second.doc.blocks.size());
    for (BlockId b : e->second.doc.blocks) pool_->SetCached(b, false);
    num_blocks_ -= freed;
    if (auto o = offsets_.find(key.doc); o != offsets_.end()) {
      o->second.erase(key.offset);
      if (o->second.empty()) offsets_.erase(o);
    }
    lru_.erase(it);
    entries_.erase(e);
    if (listener_) listener_(key, tokens, /*stored=*/false);
    return freed;
  }
  return 0;
}

void DocumentCache::ForEachBlock(const std::function<void(BlockId)>& fn) const {
  for (const auto& [key, slot] : entries_) {
    for (BlockId b : slot.doc.blocks) fn(b);
  }
}

}  // namespace lazyattn
