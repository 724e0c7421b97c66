#include "services/worker/cache/kv_cache_manager.h"

#include "absl/strings/str_cat.h"

namespace lazyattn {

KvCacheManager::KvCacheManager(int64_t num_blocks, int block_size)
    : block_size_(block_size),
      pool_(num_blocks),
      documents_(&pool_),
      prefixes_(&pool_, block_size) {}

std::optional<BlockId> KvCacheManager::Allocate() {
  while (true) {
    if (auto b = pool_.Allocate()) return b;
    const auto doc_age = documents_.OldestEvictable();
    const auto prefix_age = prefixes_.OldestEvictable();
    if (!doc_age && !prefix_age) return std::nullopt;
    const bool evict_doc = doc_age && (!prefix_age || *doc_age <= *prefix_age);
    if ((evict_doc ? documents_.EvictOne() : prefixes_.EvictOne()) == 0) return std::nullopt;
  }
}

absl::Status KvCacheManager::CheckInvariant() const {
  if (absl::Status s = pool_.CheckInvariant(); !s.ok()) return s;
  if (absl::Status s = documents_.CheckEvictable(); !s.ok()) return s;
  if (absl::Status s = prefixes_.CheckEvictable(); !s.ok()) return s;
  std::vector<int> owners(pool_.num_blocks(), 0);
  documents_.ForEachBlock([&](BlockId b) { ++owners[b]; });
  prefixes_.ForEachBlock([&](BlockId b) { ++owners[b]; });
  for (int64_t b = 0; b < pool_.num_blocks(); ++b) {
    const bool cached = pool_.cached(static_cast<BlockId>(b));
    if (owners[b] > 1 || (owners[b] == 1) != cached) {
      return absl::InternalError(absl::StrCat("block ", b, " has ", owners[b],
                                              " cache owners but cached=", cached));
    }
  }
  return absl::OkStatus();
}

}  // namespace lazyattn
