// A running sequence's KV block table, kept between its steps instead of rebuilt for each one.
//
// The table lists, in sequence order, one entry per started block of each segment the sequence
// has reached (kernels/include/kv_block_entry.h): segments are covered in order, each whole once
// the next one starts, and the last one grows as its tokens are computed or generated. A decode
// step therefore changes at most its last entry's valid count, or appends one entry; the work per
// step is independent of the context length (a 128K-token sequence has 8,192 entries of 16-token
// blocks).
//
// Every Snapshot() is a new version of the table and says how many leading entries are unchanged
// since the version before (ForwardChunk::table_unchanged), so a backend that keeps tables on the
// device uploads only the tail. Reset() (preemption, re-prefill) starts a new sequence id: nothing
// of the old table may be reused under it.
//
// Contract with the caller: a segment's `blocks` only grow while the table covers it, and
// segments before the last covered one do not change (the engine releases every block, and resets
// the table, before anything is rebuilt). Not thread-safe (the engine thread owns it).
#ifndef LAZYATTN_SERVICES_WORKER_ENGINE_ENGINE_CORE_BLOCK_TABLE_H_
#define LAZYATTN_SERVICES_WORKER_ENGINE_ENGINE_CORE_BLOCK_TABLE_H_

#include <cstdint>
#include <span>
#include <vector>

#include "kernels/include/kv_block_entry.h"
#include "services/worker/cache/block_pool.h"

namespace lazyattn {

class SequenceBlockTable {
 public:
  explicit SequenceBlockTable(int block_size = kDefaultKvBlockSize) : block_size_(block_size) {}

  // Makes segment `index` cover its first `tokens` tokens (tokens >= 0), held in `blocks` (at
  // least ceil(tokens / block_size) of them), every entry carrying `delta`. `index` is the last
  // covered segment (it grows or shrinks) or the one after it (the last becomes final as it is);
  // any other index returns false and changes nothing: the caller then Reset()s and covers again.
  bool Cover(size_t index, std::span<const BlockId> blocks, int64_t tokens, uint32_t delta);

  // A new version of the table: its entries, and how many of them lead unchanged from the
  // previous snapshot's (0 after Reset or for the first).
  struct Snapshot {
    std::span<const KvBlockEntry> entries;
    uint64_t sequence = 0;
    uint64_t version = 0;
    int64_t unchanged = 0;
  };
  Snapshot Take();

  // Empties the table; later snapshots belong to `sequence` (never 0, never reused by the caller).
  void Reset(uint64_t sequence);

  std::span<const KvBlockEntry> entries() const { return entries_; }
  uint64_t sequence() const { return sequence_; }
  // Segments covered, and the tokens covered of the last one.
  size_t segments() const { return segment_start_.size(); }
  int64_t last_segment_tokens() const { return last_tokens_; }

 private:
  int block_size_;
  uint64_t sequence_ = 0;
  uint64_t version_ = 0;
  std::vector<KvBlockEntry> entries_;
  std::vector<size_t> segment_start_;  // first entry of each covered segment
  int64_t last_tokens_ = 0;
  // Entries below this index are as in the last snapshot (it may exceed entries_.size()).
  size_t unchanged_ = 0;
  size_t snapshot_size_ = 0;  // entries at the last snapshot
};

}  // namespace lazyattn

#endif  // LAZYATTN_SERVICES_WORKER_ENGINE_ENGINE_CORE_BLOCK_TABLE_H_
