#include "services/worker/cache/document_cache.h"

#include "absl/strings/str_cat.h"

namespace lazyattn {

DocumentCache::DocumentCache(BlockPool* pool)
    : pool_(pool), owner_(static_cast<size_t>(pool->num_blocks()), nullptr) {}

DocumentCache::~DocumentCache() {
  for (auto& [key, slot] : entries_) {
    for (BlockId b : slot.doc.blocks) pool_->SetCached(b, false);
  }
}

const CachedDocument* DocumentCache::Lookup(const DocCacheKey& key) {
  auto it = entries_.find(key);
  if (it == entries_.end()) return nullptr;
  Slot& s = it->second;
  const bool evictable = s.pinned_blocks == 0;
  if (evictable) evictable_.erase(s.doc.last_use);
  s.doc.last_use = Tick();
  ++s.doc.hits;
  if (evictable) evictable_.emplace(s.doc.last_use, &s);
  return &s.doc;
}

const CachedDocument* DocumentCache::FindAnyOffset(const DocumentKey& doc, DocCacheKey* found) {
  auto it = copy_sources_.find(doc);
  if (it == copy_sources_.end() || it->second.empty()) return nullptr;
  *found = {doc, *it->second.begin()};
  return Lookup(*found);
}

bool DocumentCache::Insert(const DocCacheKey& key, std::vector<BlockId> blocks, int64_t num_tokens,
                           Origin origin) {
  if (entries_.contains(key)) return false;
  Slot& slot = entries_[key];
  slot.key = key;
  for (BlockId b : blocks) {
    pool_->SetCached(b, true, this);
    if (b < owner_.size()) owner_[b] = &slot;
    if (b < owner_.size() && pool_->ref_count(b) > 0) ++slot.pinned_blocks;
  }
  num_blocks_ += static_cast<int64_t>(blocks.size());
  if (origin == Origin::kComputed) copy_sources_[key.doc].insert(key.offset);
  slot.doc = {.blocks = std::move(blocks), .num_tokens = num_tokens, .last_use = Tick()};
  if (slot.pinned_blocks == 0) evictable_.emplace(slot.doc.last_use, &slot);
  if (listener_) listener_(key, num_tokens, /*stored=*/true);
  return true;
}

void DocumentCache::OnPinChange(BlockId b, bool pinned) {
  Slot* s = b < owner_.size() ? owner_[b] : nullptr;
  if (s == nullptr) return;
  if (pinned) {
    if (s->pinned_blocks++ == 0) evictable_.erase(s->doc.last_use);
  } else if (--s->pinned_blocks == 0) {
    evictable_.emplace(s->doc.last_use, s);
  }
}

std::optional<uint64_t> DocumentCache::OldestEvictable() const {
  if (evictable_.empty()) return std::nullopt;
  return evictable_.begin()->first;
}

int64_t DocumentCache::EvictOne() {
  if (evictable_.empty()) return 0;
  Slot& s = *evictable_.begin()->second;
  evictable_.erase(evictable_.begin());
  const DocCacheKey key = s.key;
  const int64_t tokens = s.doc.num_tokens;
  const int64_t freed = static_cast<int64_t>(s.doc.blocks.size());
  for (BlockId b : s.doc.blocks) {
    if (b < owner_.size()) owner_[b] = nullptr;
    pool_->SetCached(b, false);
  }
  num_blocks_ -= freed;
  if (auto o = copy_sources_.find(key.doc); o != copy_sources_.end()) {
    o->second.erase(key.offset);
    if (o->second.empty()) copy_sources_.erase(o);
  }
  entries_.erase(key);  // destroys s
  if (listener_) listener_(key, tokens, /*stored=*/false);
  return freed;
}

void DocumentCache::ForEachBlock(const std::function<void(BlockId)>& fn) const {
  for (const auto& [key, slot] : entries_) {
    for (BlockId b : slot.doc.blocks) fn(b);
  }
}

absl::Status DocumentCache::CheckEvictable() const {
  size_t evictable = 0;
  for (const auto& [key, slot] : entries_) {
    int64_t pinned = 0;
    for (BlockId b : slot.doc.blocks) pinned += pool_->ref_count(b) > 0;
    auto it = evictable_.find(slot.doc.last_use);
    const bool listed = it != evictable_.end() && it->second == &slot;
    if (pinned != slot.pinned_blocks || listed != (pinned == 0)) {
      return absl::InternalError(absl::StrCat(
          "document cache entry at offset ", key.offset, " has ", pinned, " pinned blocks, counted ",
          slot.pinned_blocks, listed ? ", listed" : ", not listed", " as evictable"));
    }
    evictable += listed;
  }
  if (evictable != evictable_.size()) {
    return absl::InternalError(absl::StrCat("document cache lists ", evictable_.size(),
                                            " evictable entries, ", evictable, " are"));
  }
  return absl::OkStatus();
}

}  // namespace lazyattn
