#include "services/worker/cache/block_pool.h"

#include "absl/strings/str_cat.h"

namespace lazyattn {

BlockPool::BlockPool(int64_t num_blocks)
    : ref_count_(num_blocks, 0), cached_(num_blocks, false), observer_(num_blocks, nullptr) {
  free_.reserve(num_blocks);
  for (int64_t b = num_blocks - 1; b >= 0; --b) free_.push_back(static_cast<BlockId>(b));
}

std::optional<BlockId> BlockPool::Allocate() {
  if (free_.empty()) return std::nullopt;
  const BlockId b = free_.back();
  free_.pop_back();
  ref_count_[b] = 1;
  ++num_referenced_;
  return b;
}

bool BlockPool::Misuse(const char* what, BlockId b) {
  if (errors_++ == 0) first_error_ = absl::StrCat(what, " ", b);
  return false;
}

bool BlockPool::Ref(BlockId b) {
  if (b >= ref_count_.size() || is_free(b)) return Misuse("ref of a free or unknown block", b);
  if (ref_count_[b]++ == 0) {
    ++num_referenced_;
    if (cached_[b]) {
      --num_cached_unreferenced_;
      if (observer_[b] != nullptr) observer_[b]->OnPinChange(b, /*pinned=*/true);
    }
  }
  return true;
}

bool BlockPool::Unref(BlockId b) {
  if (b >= ref_count_.size() || ref_count_[b] <= 0) {
    return Misuse("unref of an unreferenced or unknown block", b);
  }
  if (--ref_count_[b] > 0) return true;
  --num_referenced_;
  if (cached_[b]) {
    ++num_cached_unreferenced_;
    if (observer_[b] != nullptr) observer_[b]->OnPinChange(b, /*pinned=*/false);
  } else {
    Release(b);
  }
  return true;
}

bool BlockPool::SetCached(BlockId b, bool cached, PinObserver* observer) {
  if (b >= ref_count_.size()) return Misuse("caching of an unknown block", b);
  if (cached_[b] == cached) return true;
  if (cached && ref_count_[b] == 0) return Misuse("caching of a free block", b);
  cached_[b] = cached;
  observer_[b] = cached ? observer : nullptr;
  if (ref_count_[b] > 0) return true;
  --num_cached_unreferenced_;  // uncached while unreferenced: nobody holds it any more
  Release(b);
  return true;
}

void BlockPool::Release(BlockId b) { free_.push_back(b); }

absl::Status BlockPool::CheckInvariant() const {
  if (errors_ > 0) {
    return absl::InternalError(absl::StrCat(errors_, " misuses of the block pool, first: ", first_error_));
  }
  int64_t referenced = 0, cached_unref = 0, free_count = 0;
  std::vector<bool> on_free_list(ref_count_.size(), false);
  for (BlockId b : free_) {
    if (on_free_list[b]) return absl::InternalError(absl::StrCat("block ", b, " freed twice"));
    on_free_list[b] = true;
  }
  for (size_t b = 0; b < ref_count_.size(); ++b) {
    if (ref_count_[b] < 0) return absl::InternalError(absl::StrCat("block ", b, " negative refs"));
    const bool free = ref_count_[b] == 0 && !cached_[b];
    if (free != on_free_list[b]) {
      return absl::InternalError(absl::StrCat("block ", b, free ? " leaked (free but not on the list)"
                                                                : " on the free list but in use"));
    }
    if (ref_count_[b] > 0) ++referenced;
    else if (cached_[b]) ++cached_unref;
    else ++free_count;
  }
  if (referenced != num_referenced_ || cached_unref != num_cached_unreferenced_ ||
      free_count + referenced + cached_unref != num_blocks()) {
    return absl::InternalError(absl::StrCat("block counts drifted: referenced ", referenced, "/",
                                            num_referenced_, ", cached ", cached_unref, "/",
                                            num_cached_unreferenced_, ", free ", free_count));
  }
  return absl::OkStatus();
}

}  // namespace lazyattn
