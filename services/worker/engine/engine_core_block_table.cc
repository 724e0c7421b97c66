#include "services/worker/engine/engine_core_block_table.h"

#include <algorithm>

namespace lazyattn {

bool SequenceBlockTable::Cover(size_t index, std::span<const BlockId> blocks, int64_t tokens,
                               uint32_t delta) {
  const int64_t B = block_size_;
  const size_t needed = static_cast<size_t>((std::max<int64_t>(tokens, 0) + B - 1) / B);
  if (tokens < 0 || blocks.size() < needed) return false;
  if (index == segment_start_.size()) {
    segment_start_.push_back(entries_.size());
    last_tokens_ = 0;
  } else if (index + 1 != segment_start_.size()) {
    return false;
  }
  const size_t start = segment_start_.back();
  const size_t have = entries_.size() - start;
  // The entries this segment keeps: a shrink drops the tail, and the last kept entry's count is
  // rewritten (it may have been full or partial before).
  const size_t keep = std::min(have, needed);
  if (keep < have) {
    entries_.resize(start + keep);
    unchanged_ = std::min(unchanged_, start + keep);
  }
  auto entry = [&](size_t b) {
    const int64_t valid = std::min<int64_t>(B, tokens - static_cast<int64_t>(b) * B);
    return PackKvBlockEntry(blocks[b], delta, static_cast<uint32_t>(valid));
  };
  if (keep > 0) {
    const size_t last = start + keep - 1;
    const KvBlockEntry e = entry(keep - 1);
    if (entries_[last] != e) {
      entries_[last] = e;
      unchanged_ = std::min(unchanged_, last);
    }
  }
  for (size_t b = keep; b < needed; ++b) entries_.push_back(entry(b));
  last_tokens_ = tokens;
  return true;
}

SequenceBlockTable::Snapshot SequenceBlockTable::Take() {
  Snapshot s{.entries = entries_,
             .sequence = sequence_,
             .version = ++version_,
             .unchanged = static_cast<int64_t>(std::min({unchanged_, snapshot_size_,
                                                         entries_.size()}))};
  unchanged_ = entries_.size();
  snapshot_size_ = entries_.size();
  return s;
}

void SequenceBlockTable::Reset(uint64_t sequence) {
  sequence_ = sequence;
  version_ = 0;
  entries_.clear();
  segment_start_.clear();
  last_tokens_ = 0;
  unchanged_ = 0;
  snapshot_size_ = 0;
}

}  // namespace lazyattn
