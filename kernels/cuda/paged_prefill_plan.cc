// The paged prefill plan (paged_prefill_attention.h, PagedPrefillPlan): the host-side schedule
// of work items, split-KV ranges and merge groups, and the metadata both kernels read. Host code
// only, apart from the kernels, so that the scheduling can be read (and changed) on its own.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/paged_prefill_attention.h"
#include "kernels/cuda/paged_prefill_tiling.h"

namespace lazyattn {
namespace {

using prefill_internal::kBlockM;  // query rows per CTA
using prefill_internal::kCombineWords;
using prefill_internal::kEntriesPerTile;
using prefill_internal::kEntryWords;
using prefill_internal::kKvBlock;  // slots per KV block
using prefill_internal::kMaxSplits;
using prefill_internal::kSeqWords;
using prefill_internal::kWorkWords;

constexpr int kMinTilesPerSplit = 4;

// Split-KV boundaries of one query tile's key range [0, tiles): at most `max_splits` ranges of at
// most `max_len` tiles each. kRotateQ rotates a CTA's Q rows in place for the first delta of its
// range (cheap), but rebuilds them from global memory at every later change of delta (measured
// ~1 tile of work each). So a range costs its tiles plus one per change of delta after its first
// entry, and the ranges minimize the largest cost: where the tile budget allows, a range starts
// at a segment start instead of just before it. change_inner[j] counts the changes between the
// entries of tile j, change_start[j] is 1 when tile j's first entry starts a new segment. Greedy
// partition (optimal for a given cost bound) plus a binary search on the bound. Returns the
// first tile of each range.
std::vector<int> SplitRanges(const std::vector<int>& change_inner,
                             const std::vector<int>& change_start, int tiles, int max_splits,
                             int max_len) {
  auto partition = [&](int64_t bound) {
    std::vector<int> begins = {0};
    int64_t cost = 1 + change_inner[0];
    for (int j = 1; j < tiles; ++j) {
      const int64_t c = 1 + change_inner[j] + change_start[j];
      if (j - begins.back() >= max_len || cost + c > bound) {
        begins.push_back(j);
        cost = 1 + change_inner[j];
      } else {
        cost += c;
      }
    }
    return begins;
  };
  int64_t lo = 1, hi = max_len;
  for (int j = 0; j < tiles; ++j) {
    lo = std::max<int64_t>(lo, 1 + change_inner[j]);
    hi += change_inner[j] + change_start[j];
  }
  // hi is feasible: with it only max_len binds, which gives ceil(tiles / max_len) <= max_splits.
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (static_cast<int>(partition(mid).size()) <= max_splits) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return partition(hi);
}

}  // namespace

absl::Status PagedPrefillPlan::Build(const PagedPrefillShape& shape,
                                     const PagedPrefillSequence* seqs, int num_seqs,
                                     const PagedPrefillPlanOptions& options) {
  if (shape.head_dim != 64 && shape.head_dim != 128) {
    return absl::InvalidArgumentError(
        absl::StrCat("paged prefill: head_dim ", shape.head_dim, " unsupported (64 or 128)"));
  }
  if (shape.block_size != kKvBlock) {
    return absl::InvalidArgumentError(
        absl::StrCat("paged prefill: block_size ", shape.block_size, " unsupported (16)"));
  }
  if (shape.num_kv_heads <= 0 || shape.num_heads <= 0 ||
      shape.num_heads % shape.num_kv_heads != 0 || shape.num_heads / shape.num_kv_heads > kBlockM) {
    return absl::InvalidArgumentError(absl::StrCat("paged prefill: ", shape.num_heads,
                                                   " query heads over ", shape.num_kv_heads,
                                                   " KV heads unsupported"));
  }
  if (num_seqs < 0 || (num_seqs > 0 && seqs == nullptr)) {
    return absl::InvalidArgumentError("paged prefill: no sequences");
  }
  if (options.ctas_per_sm < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("paged prefill: ctas_per_sm ", options.ctas_per_sm, " (must be >= 1)"));
  }
  shape_ = shape;
  const int group = shape.num_heads / shape.num_kv_heads;
  const int tokens_per_cta = kBlockM / group;

  struct Tile {
    int seq, m_tok0, n_tok, tiles;
  };
  std::vector<Tile> tiles;
  std::vector<int64_t> key_start;
  // Per sequence and K tile: changes of delta inside the tile, and whether it starts a segment.
  std::vector<std::vector<int>> change_inner(num_seqs), change_start(num_seqs);
  int64_t total_entries = 0, total_break_words = 0, q_total = 0;
  for (int s = 0; s < num_seqs; ++s) {
    const PagedPrefillSequence& sq = seqs[s];
    if (sq.num_queries < 0 || sq.num_blocks < 0 || sq.first_query_index < 0 ||
        (sq.num_blocks > 0 && sq.block_table == nullptr)) {
      return absl::InvalidArgumentError(absl::StrCat("paged prefill: sequence ", s, " malformed"));
    }
    total_entries += sq.num_blocks;
    total_break_words += (sq.num_blocks + kEntriesPerTile - 1) / kEntriesPerTile + 2;
    q_total += sq.num_queries;
  }
  if (q_total > INT32_MAX / 2 || total_entries > INT32_MAX / 8) {
    return absl::InvalidArgumentError("paged prefill: batch too large");
  }

  layout_.seqs = 0;
  layout_.entries = (static_cast<int64_t>(num_seqs) * kSeqWords + 3) / 4 * 4;
  layout_.breaks = layout_.entries + total_entries * kEntryWords;
  layout_.work = layout_.breaks + total_break_words;
  words_.assign(layout_.work, 0);
  // Per sequence: whether its K tile j is uniform at delta 0 (then a range starting at j, where
  // the kernel's q' starts unrotated, begins with a plain tile).
  std::vector<std::vector<char>> uniform_zero(num_seqs);

  int64_t q_start = 0, entry_start = 0, break_start = 0;
  for (int s = 0; s < num_seqs; ++s) {
    const PagedPrefillSequence& sq = seqs[s];
    key_start.assign(sq.num_blocks, 0);
    int64_t keys = 0;
    for (int b = 0; b < sq.num_blocks; ++b) {
      const KvBlockEntry e = sq.block_table[b];
      const uint32_t valid = KvEntryValid(e);
      if (valid < 1 || valid > static_cast<uint32_t>(kKvBlock)) {
        return absl::InvalidArgumentError(absl::StrCat("paged prefill: sequence ", s, " block ", b,
                                                       " has ", valid, " valid slots (1..16)"));
      }
      if (KvEntryDelta(e) >= options.rope_max_positions) {
        return absl::InvalidArgumentError(
            absl::StrCat("paged prefill: sequence ", s, " block ", b, " delta ", KvEntryDelta(e),
                         " outside the RoPE table (", options.rope_max_positions, " positions)"));
      }
      if (shape.num_pool_blocks > 0 && KvEntryBlock(e) >= shape.num_pool_blocks) {
        return absl::InvalidArgumentError(absl::StrCat("paged prefill: sequence ", s, " block ", b,
                                                       " is physical block ", KvEntryBlock(e),
                                                       " past the pool"));
      }
      int32_t* w = &words_[layout_.entries + (entry_start + b) * kEntryWords];
      w[0] = static_cast<int32_t>(KvEntryBlock(e));
      w[1] = static_cast<int32_t>(KvEntryDelta(e));
      w[2] = static_cast<int32_t>(valid);
      w[3] = static_cast<int32_t>(keys);
      key_start[b] = keys;
      keys += valid;
      if (b % kEntriesPerTile == 0) {
        change_inner[s].push_back(0);
        change_start[s].push_back(0);
      }
      if (b > 0 && KvEntryDelta(e) != KvEntryDelta(sq.block_table[b - 1])) {
        (b % kEntriesPerTile == 0 ? change_start[s] : change_inner[s]).back() += 1;
      }
    }
    if (keys + sq.first_query_index + sq.num_queries > INT32_MAX / 2) {
      return absl::InvalidArgumentError(absl::StrCat("paged prefill: sequence ", s, " too long"));
    }
    // Plain tiles and break points (kRotateQ of the wgmma kernel; see the header). Tile j is
    // uniform when its entries share one delta; after a tile, the kernel's q' sits at the delta
    // of the tile's last pass, i.e. of the distinct delta that appears last for the first time
    // (passes go in order of first appearance); tile j >= 1 is plain when it is uniform at the
    // delta its predecessor leaves. breaks[j] = the first tile >= j that is not plain (tile 0
    // counts as not plain), breaks[tiles] = breaks[tiles + 1] = tiles (sentinels: the kernel
    // reads breaks[j + 1] after a break at any tile j it runs, the last one included).
    const int seq_tiles = (sq.num_blocks + kEntriesPerTile - 1) / kEntriesPerTile;
    int32_t* breaks = &words_[layout_.breaks + break_start];
    breaks[seq_tiles] = breaks[seq_tiles + 1] = seq_tiles;
    uniform_zero[s].assign(seq_tiles, 0);
    std::vector<int64_t> after(seq_tiles), uniform_delta(seq_tiles);  // -1: not uniform
    for (int j = 0; j < seq_tiles; ++j) {
      const int b0 = j * kEntriesPerTile, b1 = std::min(b0 + kEntriesPerTile, sq.num_blocks);
      int64_t seen[kEntriesPerTile];
      int num_seen = 0;
      for (int b = b0; b < b1; ++b) {
        const int64_t d = static_cast<int64_t>(KvEntryDelta(sq.block_table[b]));
        if (std::find(seen, seen + num_seen, d) == seen + num_seen) seen[num_seen++] = d;
      }
      after[j] = seen[num_seen - 1];
      uniform_delta[j] = num_seen == 1 ? seen[0] : -1;
      uniform_zero[s][j] = uniform_delta[j] == 0 ? 1 : 0;
    }
    for (int j = seq_tiles - 1; j >= 0; --j) {
      const bool plain = j > 0 && uniform_delta[j] >= 0 && uniform_delta[j] == after[j - 1];
      breaks[j] = plain ? breaks[j + 1] : j;
    }
    // The sequence's words, read back by prefill_internal::LoadWorkItem.
    int32_t* w = &words_[layout_.seqs + static_cast<int64_t>(s) * kSeqWords];
    w[0] = static_cast<int32_t>(q_start);
    w[1] = sq.num_queries;
    w[2] = static_cast<int32_t>(entry_start);
    w[3] = sq.num_blocks;
    w[4] = static_cast<int32_t>(sq.first_query_index);
    w[5] = static_cast<int32_t>(break_start);
    for (int m = 0; m < sq.num_queries; m += tokens_per_cta) {
      const int n = std::min(tokens_per_cta, sq.num_queries - m);
      const int64_t last_q = sq.first_query_index + m + n - 1;
      // Entries whose first key is visible to the tile's last query.
      const int64_t needed =
          std::upper_bound(key_start.begin(), key_start.end(), last_q) - key_start.begin();
      tiles.push_back(
          {s, m, n, static_cast<int>((needed + kEntriesPerTile - 1) / kEntriesPerTile)});
    }
    q_start += sq.num_queries;
    entry_start += sq.num_blocks;
    break_start += seq_tiles + 2;
  }
  total_queries_ = q_total;

  // Split KV when the query tiles alone would leave most of the chip idle.
  int splits_target = 1;
  const int64_t base_ctas = static_cast<int64_t>(tiles.size()) * shape.num_kv_heads;
  if (options.sm_count > 0 && options.max_splits > 1 && base_ctas > 0) {
    const int64_t slots = static_cast<int64_t>(options.sm_count) * options.ctas_per_sm;
    splits_target = static_cast<int>(
        std::clamp<int64_t>(slots / base_ctas, 1, std::min(options.max_splits, kMaxSplits)));
  }
  struct Work {
    int seq, m_tok0, n_tok, t_begin, t_end, partial;
  };
  std::vector<Work> work;
  std::vector<int32_t> combine;
  num_partials_ = 0;
  for (const Tile& t : tiles) {
    int splits = std::min(splits_target, std::max(1, t.tiles / kMinTilesPerSplit));
    const int per_split = splits > 1 ? (t.tiles + splits - 1) / splits : t.tiles;
    if (splits > 1) splits = (t.tiles + per_split - 1) / per_split;
    if (splits <= 1) {
      work.push_back({t.seq, t.m_tok0, t.n_tok, 0, t.tiles, -1});
      continue;
    }
    // No range longer than the even split's, so the rotation-free kernel never loses.
    const std::vector<int> begins =
        SplitRanges(change_inner[t.seq], change_start[t.seq], t.tiles, splits, per_split);
    splits = static_cast<int>(begins.size());
    if (splits <= 1) {
      work.push_back({t.seq, t.m_tok0, t.n_tok, 0, t.tiles, -1});
      continue;
    }
    const int base = num_partials_;
    num_partials_ += splits;
    for (int k = 0; k < splits; ++k) {
      work.push_back({t.seq, t.m_tok0, t.n_tok, begins[k], k + 1 < splits ? begins[k + 1] : t.tiles,
                      base + k});
    }
    combine.insert(combine.end(), {t.seq, t.m_tok0, t.n_tok, base, splits, 0, 0, 0});
  }
  // Heaviest first, so the long causal tiles do not trail at the end of the grid.
  std::stable_sort(work.begin(), work.end(), [](const Work& a, const Work& b) {
    return a.t_end - a.t_begin > b.t_end - b.t_begin;
  });
  num_work_ = static_cast<int>(work.size());
  num_combine_ = static_cast<int>(combine.size() / kCombineWords);
  layout_.combine = layout_.work + static_cast<int64_t>(num_work_) * kWorkWords;
  words_.resize(layout_.combine + combine.size(), 0);
  for (int i = 0; i < num_work_; ++i) {
    // The work item's words, read back by prefill_internal::LoadWorkItem.
    int32_t* w = &words_[layout_.work + static_cast<int64_t>(i) * kWorkWords];
    const Work& x = work[i];
    w[0] = x.seq;
    w[1] = x.m_tok0;
    w[2] = x.n_tok;
    w[3] = x.t_begin;
    w[4] = x.t_end;
    w[5] = x.partial;
    // The first tile of the range that is not plain, the range starting at q' = q (delta 0).
    const int32_t* breaks =
        &words_[layout_.breaks + words_[layout_.seqs + x.seq * kSeqWords + 5]];
    w[6] = x.t_begin < x.t_end && uniform_zero[x.seq][x.t_begin] ? breaks[x.t_begin + 1]
                                                                 : x.t_begin;
  }
  std::copy(combine.begin(), combine.end(), words_.begin() + layout_.combine);
  if (words_.empty()) words_.push_back(0);
  return absl::OkStatus();
}

int64_t PagedPrefillPlan::workspace_bytes() const {
  return static_cast<int64_t>(num_partials_) * shape_.num_kv_heads * kBlockM *
         (shape_.head_dim + 1) * 4;
}

absl::Status PagedPrefillPlan::Upload(void* device_metadata, cudaStream_t stream) const {
  if (device_metadata == nullptr) {
    return absl::InvalidArgumentError("paged prefill: no device metadata buffer");
  }
  RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(device_metadata, words_.data(), metadata_bytes(),
                                       cudaMemcpyHostToDevice, stream));
  return absl::OkStatus();
}

}  // namespace lazyattn
